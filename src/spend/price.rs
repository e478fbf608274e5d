//! [`Prices`]: what a [`Usage`] costs, per model, in millionths of a dollar
//! (or in tokens).

use std::fmt;
use std::sync::Arc;

use super::usage::Usage;
use crate::breaker::spend::Charge;

/// A model's prices, in dollars per million tokens (which is also
/// millionths of a dollar per token).
///
/// ```
/// use tower_circuit_breaker::spend::{Price, Prices, Usage};
///
/// let prices = Prices::new().model("gpt-4o", Price::per_million(2.50, 10.00, 1.25));
/// let usage = Usage::new(1_000, 2_000, 500).with_model("gpt-4o-2024-08-06");
/// // 1000 × 2.50 + 2000 × 1.25 + 500 × 10.00 = 10_000 µ$, one cent.
/// assert_eq!(prices.cost(&usage), Some(10_000));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Price {
    input: f64,
    output: f64,
    cached_input: f64,
    unknown: Option<u64>,
}

impl Price {
    /// Input, output and cached-input prices in dollars per million tokens.
    /// A price that is negative or not finite counts as 0.
    #[must_use]
    pub fn per_million(input: f64, output: f64, cached_input: f64) -> Self {
        let ok = |p: f64| if p.is_finite() && p > 0.0 { p } else { 0.0 };
        Price {
            input: ok(input),
            output: ok(output),
            cached_input: ok(cached_input),
            unknown: None,
        }
    }

    /// What a call to this model whose usage never arrived is charged, in
    /// millionths of a dollar (when the model is known: an OpenAI stream
    /// without `include_usage`, a `usage` that does not parse). Without it,
    /// such a call is charged the breaker's
    /// [`unknown_cost`](super::SpendGuard::unknown_cost), or its running
    /// average.
    #[must_use]
    pub fn unknown_cost(mut self, micro_dollars: u64) -> Self {
        self.unknown = Some(micro_dollars);
        self
    }

    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a cost of non-negative terms, converted by a saturating `as`"
    )]
    fn cost(&self, usage: &Usage) -> u64 {
        let c = usage.input() as f64 * self.input
            + usage.output() as f64 * self.output
            + usage.cached_input() as f64 * self.cached_input;
        // Rounded up (a call is never free for rounding), saturating.
        c.ceil() as u64
    }
}

type Otherwise = Arc<dyn Fn(&Usage) -> Option<u64> + Send + Sync>;

/// A price table: what a [`Usage`] costs, by the model the answer names.
///
/// A model is found by its longest listed prefix, so `"gpt-4o"` prices
/// `"gpt-4o-2024-08-06"` and `"gpt-4o-mini"` can be listed apart. A model
/// the table does not list goes to the [`otherwise`](Self::otherwise)
/// closure; with none, or when it answers `None` (or panics), the call is
/// charged as one whose usage never arrived.
///
/// [`Prices::tokens`] counts tokens instead, for a budget in tokens.
///
/// ```
/// use tower_circuit_breaker::spend::{Price, Prices, Usage};
///
/// let prices = Prices::new()
///     .model("claude-sonnet-4", Price::per_million(3.0, 15.0, 0.30))
///     .otherwise(|usage: &Usage| Some(usage.total() * 2)); // $2 per million, flat
/// assert_eq!(prices.cost(&Usage::new(100, 0, 100).with_model("claude-sonnet-4-5")), Some(1_800));
/// assert_eq!(prices.cost(&Usage::new(100, 0, 100).with_model("llama")), Some(400));
/// assert_eq!(Prices::tokens().cost(&Usage::new(100, 20, 5)), Some(125));
/// ```
#[derive(Clone)]
pub struct Prices {
    models: Vec<(Box<str>, Price)>,
    otherwise: Option<Otherwise>,
    tokens: bool,
}

impl Default for Prices {
    fn default() -> Self {
        Prices::new()
    }
}

impl fmt::Debug for Prices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Prices")
            .field("models", &self.models)
            .field("otherwise", &self.otherwise.is_some())
            .field("tokens", &self.tokens)
            .finish()
    }
}

impl Prices {
    /// An empty table, in millionths of a dollar.
    #[must_use]
    pub fn new() -> Self {
        Prices {
            models: Vec::new(),
            otherwise: None,
            tokens: false,
        }
    }

    /// Counts tokens: a call costs [`Usage::total`].
    #[must_use]
    pub fn tokens() -> Self {
        Prices {
            tokens: true,
            ..Prices::new()
        }
    }

    /// Prices models whose name starts with `prefix`.
    #[must_use]
    pub fn model(mut self, prefix: &str, price: Price) -> Self {
        self.models.retain(|(p, _)| &**p != prefix);
        self.models.push((prefix.into(), price));
        self
    }

    /// Prices what the table does not list (a user closure: a panic in it
    /// is contained, and the call charged as one of unknown usage).
    #[must_use]
    pub fn otherwise<F>(mut self, price: F) -> Self
    where
        F: Fn(&Usage) -> Option<u64> + Send + Sync + 'static,
    {
        self.otherwise = Some(Arc::new(price));
        self
    }

    fn find(&self, model: Option<&str>) -> Option<&Price> {
        let model = model?;
        self.models
            .iter()
            .filter(|(prefix, _)| model.starts_with(&**prefix))
            .max_by_key(|(prefix, _)| prefix.len())
            .map(|(_, price)| price)
    }

    /// What `usage` costs; `None` when the table cannot say.
    #[must_use]
    pub fn cost(&self, usage: &Usage) -> Option<u64> {
        if self.tokens {
            return Some(usage.total());
        }
        if let Some(price) = self.find(usage.model()) {
            return Some(price.cost(usage));
        }
        let otherwise = self.otherwise.as_ref()?;
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| otherwise(usage))).unwrap_or_else(
            |_| {
                tracing::error!(
                    target: "tower_circuit_breaker",
                    "price closure panicked; the call is charged as one of unknown usage"
                );
                None
            },
        )
    }

    /// The charge of a call whose answer gave `usage` (if any) and named
    /// `model` (if any).
    pub(crate) fn charge(&self, usage: Option<&Usage>, model: Option<&str>) -> Charge {
        if let Some(cost) = usage.and_then(|u| self.cost(u)) {
            return Charge::Observed(cost);
        }
        match self.find(model).and_then(|p| p.unknown) {
            Some(cost) => Charge::Estimated(cost),
            None => Charge::Unknown,
        }
    }
}
