//! How many replicas must agree before a shared circuit opens.

/// How many replicas must agree before a shared circuit opens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Quorum {
    /// At least this many, or every replica alive when fewer are.
    Replicas(u32),
    /// At least this share of the replicas alive, rounded up.
    Fraction(f64),
}

impl Quorum {
    /// The replicas that must agree when `alive` replicas are alive: never
    /// fewer than one, never more than are alive.
    pub(crate) fn needed(self, alive: u32) -> u32 {
        let n = match self {
            Quorum::Replicas(n) => n,
            #[allow(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "f is in (0, 1], so the product is in [0, alive]"
            )]
            Quorum::Fraction(f) => (f * f64::from(alive)).ceil() as u32,
        };
        n.min(alive).max(1)
    }
}
