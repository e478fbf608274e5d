//! Taking a breaker key from a request.

use std::fmt;
use std::marker::PhantomData;

use http::header::HeaderName;
use http::Request;
// SipHash-2-4 rather than HMAC-SHA-256: a key is a short string hashed on the
// request path, SipHash is a PRF made for short inputs (tens of nanoseconds
// against a microsecond-scale HMAC), and `siphasher` is one small crate with
// no dependencies where HMAC would bring `hmac`, `sha2`, `digest` and theirs.
// A 64-bit tag is enough here: it must not be forged or reversed without the
// secret, and 10,000 keys collide by chance with odds near 3e-12.
use siphasher::sip::SipHasher24;
use siphasher::sip128::SipHasher24 as SipHasher128;

/// A breaker key taken from a request, borrowed from it where possible so
/// that a lookup does not allocate.
#[derive(Clone)]
pub struct Key<'a>(Repr<'a>);

#[derive(Clone)]
enum Repr<'a> {
    Borrowed(&'a str),
    Inline { buf: [u8; 23], len: u8 },
    Owned(Box<str>),
}

impl<'a> Key<'a> {
    /// The key as a string.
    ///
    /// ```
    /// use tower_circuit_breaker::keyed::Key;
    ///
    /// assert_eq!(Key::from("gpt-4o").as_str(), "gpt-4o");
    /// ```
    #[inline]
    #[must_use]
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Borrowed(s) => s,
            Repr::Inline { buf, len } => inline_str(buf, *len),
            Repr::Owned(s) => s,
        }
    }

    /// A key that stands for a credential (an API key, to gate one
    /// account's quota) without revealing it: `#` and 16 hex digits of the
    /// credential's SipHash-2-4 under `secret`. Every replica configured with
    /// the same secret computes the same key; without the secret, a key seen
    /// in a log line or a Redis key name cannot be checked against guesses,
    /// nor can keys be made to collide on purpose. Events, errors and
    /// snapshots only ever show this form.
    ///
    /// ```
    /// use tower_circuit_breaker::keyed::{Key, KeySecret};
    ///
    /// let secret = KeySecret::new("read-me-from-your-secret-store")?;
    /// let k = Key::hashed(&secret, b"sk-live-0123456789");
    /// assert_eq!(k.as_str().len(), 17);
    /// assert!(!k.as_str().contains("sk-live"));
    /// assert_eq!(k.as_str(), Key::hashed(&secret, b"sk-live-0123456789").as_str());
    ///
    /// let other = KeySecret::new("another-deployment's-secret")?;
    /// assert_ne!(k.as_str(), Key::hashed(&other, b"sk-live-0123456789").as_str());
    /// # Ok::<_, tower_circuit_breaker::keyed::KeySecretError>(())
    /// ```
    #[must_use]
    pub fn hashed(secret: &KeySecret, credential: &[u8]) -> Key<'static> {
        let h = secret.hash(credential);
        let mut buf = [0u8; 23];
        buf[0] = b'#';
        for i in 0..16 {
            let nibble = ((h >> (60 - 4 * i)) & 0xf) as u8;
            buf[1 + i] = b"0123456789abcdef"[usize::from(nibble)];
        }
        Key(Repr::Inline { buf, len: 17 })
    }
}

/// The text of an inline key, which `hashed` only ever fills with ASCII.
fn inline_str(buf: &[u8; 23], len: u8) -> &str {
    std::str::from_utf8(&buf[..usize::from(len)]).unwrap_or("")
}

/// Whether two keys are equal. Keys are short (a model name, a host, a
/// 17-byte hashed credential), and comparing them a word at a time inline
/// costs a fraction of a call to `memcmp`, which a lookup would otherwise
/// make every time.
#[inline]
pub(super) fn same_key(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let n = a.len();
    if n != b.len() {
        return false;
    }
    let word = |s: &[u8], at: usize| {
        let mut w = [0; 8];
        w.copy_from_slice(&s[at..at + 8]);
        u64::from_ne_bytes(w)
    };
    let half = |s: &[u8], at: usize| {
        let mut w = [0; 4];
        w.copy_from_slice(&s[at..at + 4]);
        u32::from_ne_bytes(w)
    };
    // Two loads from each end, which overlap in the middle of a short key.
    match n {
        0..=3 => a.iter().zip(b).all(|(x, y)| x == y),
        4..=7 => half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4),
        8..=16 => word(a, 0) == word(b, 0) && word(a, n - 8) == word(b, n - 8),
        17..=24 => {
            word(a, 0) == word(b, 0) && word(a, 8) == word(b, 8) && word(a, n - 8) == word(b, n - 8)
        }
        _ => a == b,
    }
}

// === impl KeySecret ===

/// The secret that keys the hash of credential keys ([`Key::hashed`],
/// [`header_hashed`]).
///
/// Configure it like any other secret (from a secret store or the
/// environment, never from source code), and give every replica the same one:
/// with the [Redis backend](crate::redis) the replicas find one account's
/// breaker by its hashed key, so replicas with different secrets would each
/// keep their own breaker for it.
///
/// Its `Debug` output never shows the secret.
///
/// ```
/// use tower_circuit_breaker::keyed::{KeySecret, KeySecretError};
///
/// let secret = KeySecret::new("0123456789abcdef0123456789abcdef")?;
/// assert_eq!(format!("{secret:?}"), "KeySecret(..)");
/// assert_eq!(KeySecret::new("short").unwrap_err(), KeySecretError::TooShort { len: 5 });
/// # Ok::<_, KeySecretError>(())
/// ```
#[derive(Clone)]
pub struct KeySecret {
    k0: u64,
    k1: u64,
}

impl KeySecret {
    /// The fewest bytes a secret may have: 16, the size of a SipHash key.
    pub const MIN_LEN: usize = 16;

    /// A secret from at least [`MIN_LEN`](Self::MIN_LEN) bytes, which
    /// should be random (say 32 random bytes, or their hex or base64 text).
    /// Any length above the minimum is accepted: the bytes are compressed to
    /// a 128-bit key.
    ///
    /// # Errors
    ///
    /// A [`KeySecretError`] when the secret is shorter than
    /// [`MIN_LEN`](Self::MIN_LEN).
    pub fn new(secret: impl AsRef<[u8]>) -> Result<KeySecret, KeySecretError> {
        let secret = secret.as_ref();
        if secret.len() < Self::MIN_LEN {
            return Err(KeySecretError::TooShort { len: secret.len() });
        }
        // Compress whatever the user holds to SipHash's 128-bit key. The
        // derivation key is public: it only separates this use from others,
        // the secrecy comes from the input.
        let key =
            SipHasher128::new_with_keys(0x7463_622d_6b65_7973, 0x6b65_7965_642d_6b64).hash(secret);
        Ok(KeySecret {
            k0: key.h1,
            k1: key.h2,
        })
    }

    #[inline]
    fn hash(&self, credential: &[u8]) -> u64 {
        SipHasher24::new_with_keys(self.k0, self.k1).hash(credential)
    }
}

impl fmt::Debug for KeySecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeySecret(..)")
    }
}

/// A [`KeySecret`] that could not be made.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeySecretError {
    /// Fewer than [`KeySecret::MIN_LEN`] bytes.
    TooShort {
        /// How many bytes it had.
        len: usize,
    },
}

impl fmt::Display for KeySecretError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeySecretError::TooShort { len } => write!(
                f,
                "key secret has {len} bytes, needs at least {}",
                KeySecret::MIN_LEN
            ),
        }
    }
}

impl std::error::Error for KeySecretError {}

impl<'a> From<&'a str> for Key<'a> {
    fn from(s: &'a str) -> Self {
        Key(Repr::Borrowed(s))
    }
}

impl From<String> for Key<'static> {
    fn from(s: String) -> Self {
        Key(Repr::Owned(s.into_boxed_str()))
    }
}

impl fmt::Debug for Key<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

/// Takes the breaker key from a request; `None` sends the request to the
/// shared `(unkeyed)` breaker.
///
/// Implemented by [`header`], [`header_hashed`], [`authority`],
/// [`extension`] and [`from_fn`].
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot take a breaker key from a `{Req}`: it does not implement `KeyFn<{Req}>`",
    label = "not a key function for `{Req}`",
    note = "use `keyed::header`, `keyed::header_hashed`, `keyed::authority` or `keyed::extension` (for `http::Request`), or wrap a closure in `keyed::from_fn(|req| ...)`: a bare closure is not a `KeyFn`"
)]
pub trait KeyFn<Req> {
    /// The request's key.
    fn key<'a>(&self, request: &'a Req) -> Option<Key<'a>>;
}

/// Keys by the value of a header (such as the model name). See [`header`].
#[derive(Debug, Clone)]
pub struct Header(HeaderName);

/// Keys by the value of a header, e.g. `x-model`. Values that are not
/// visible ASCII count as no key.
///
/// The value itself is the key, so it appears in every event, error,
/// snapshot and Redis key name. Use this for names (a model, a region, a
/// tenant id); for a credential (`authorization`, `x-api-key`,
/// `x-goog-api-key`), use [`header_hashed`], which keys by a keyed hash of
/// the value instead.
///
/// ```
/// use tower_circuit_breaker::keyed::{header, KeyFn};
///
/// let req = http::Request::get("/").header("x-model", "gpt-4o").body(()).unwrap();
/// assert_eq!(header("x-model").key(&req).unwrap().as_str(), "gpt-4o");
/// ```
///
/// # Panics
///
/// If `name` is not a valid header name; this happens when the layer is
/// built, never per request.
#[must_use]
pub fn header(name: &'static str) -> Header {
    Header(HeaderName::from_static(name))
}

impl<B> KeyFn<Request<B>> for Header {
    #[inline]
    fn key<'a>(&self, request: &'a Request<B>) -> Option<Key<'a>> {
        request.headers().get(&self.0)?.to_str().ok().map(Key::from)
    }
}

/// Keys by a keyed hash of a header's value, for credentials. See
/// [`header_hashed`].
#[derive(Clone)]
pub struct HashedHeader {
    name: HeaderName,
    secret: KeySecret,
}

impl fmt::Debug for HashedHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HashedHeader")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Keys by a keyed hash of a header's value (`authorization`, `x-api-key`),
/// so that one account's breaker is separate from another's while the
/// credential never appears in a key, an event, an error, a snapshot or a
/// Redis key (see [`Key::hashed`]). Every replica sharing state through
/// Redis must be given the same `secret`.
///
/// ```
/// use tower_circuit_breaker::keyed::{header_hashed, KeyFn, KeySecret};
///
/// let secret = KeySecret::new("read-me-from-your-secret-store")?;
/// let key = header_hashed("x-api-key", &secret);
/// let req = http::Request::get("/").header("x-api-key", "sk-live-0123").body(()).unwrap();
/// let k = key.key(&req).unwrap();
/// assert!(k.as_str().starts_with('#') && !k.as_str().contains("sk-live"));
/// # Ok::<_, tower_circuit_breaker::keyed::KeySecretError>(())
/// ```
///
/// # Panics
///
/// If `name` is not a valid header name.
#[must_use]
pub fn header_hashed(name: &'static str, secret: &KeySecret) -> HashedHeader {
    HashedHeader {
        name: HeaderName::from_static(name),
        secret: secret.clone(),
    }
}

impl<B> KeyFn<Request<B>> for HashedHeader {
    #[inline]
    fn key<'a>(&self, request: &'a Request<B>) -> Option<Key<'a>> {
        request
            .headers()
            .get(&self.name)
            .map(|v| Key::hashed(&self.secret, v.as_bytes()))
    }
}

/// Keys by the URI's host and port. See [`authority`].
#[derive(Debug, Clone, Copy)]
pub struct Authority;

/// Keys by the request URI's host and port (`api.example.com`,
/// `api.example.com:8443`, as written in the URI): one breaker per upstream
/// host. Requests with a relative URI have no key.
///
/// Credentials in the URL (`https://user:secret@host/`) never enter the key,
/// so they appear in no event, error, snapshot or Redis key, and one host is
/// one breaker whichever credential a request carries. Neither does the path
/// or the query string (where Gemini takes `?key=`).
///
/// ```
/// use tower_circuit_breaker::keyed::{authority, KeyFn};
///
/// let req = http::Request::get("https://user:secret@api.example.com:8443/v1?key=AIza")
///     .body(())
///     .unwrap();
/// assert_eq!(authority().key(&req).unwrap().as_str(), "api.example.com:8443");
/// ```
#[must_use]
pub fn authority() -> Authority {
    Authority
}

impl<B> KeyFn<Request<B>> for Authority {
    #[inline]
    fn key<'a>(&self, request: &'a Request<B>) -> Option<Key<'a>> {
        let authority = request.uri().authority()?.as_str();
        // Userinfo ends at the last `@`, which cannot occur in a host or port.
        let host_port = match authority.rfind('@') {
            Some(at) => &authority[at + 1..],
            None => authority,
        };
        Some(Key::from(host_port))
    }
}

/// Keys by a typed request extension the caller sets. See [`extension`].
pub struct ExtensionKey<T>(PhantomData<fn() -> T>);

impl<T> fmt::Debug for ExtensionKey<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ExtensionKey")
            .field(&std::any::type_name::<T>())
            .finish()
    }
}

impl<T> Clone for ExtensionKey<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for ExtensionKey<T> {}

/// Keys by a request extension of type `T` that the caller inserts, e.g. a
/// `Route(Arc<str>)` set by routing code.
///
/// ```
/// use tower_circuit_breaker::keyed::{extension, KeyFn};
///
/// #[derive(Clone)]
/// struct Route(&'static str);
/// impl AsRef<str> for Route {
///     fn as_ref(&self) -> &str { self.0 }
/// }
///
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert(Route("gpt-4o/eu"));
/// assert_eq!(extension::<Route>().key(&req).unwrap().as_str(), "gpt-4o/eu");
/// ```
#[must_use]
pub fn extension<T>() -> ExtensionKey<T>
where
    T: AsRef<str> + Clone + Send + Sync + 'static,
{
    ExtensionKey(PhantomData)
}

impl<B, T> KeyFn<Request<B>> for ExtensionKey<T>
where
    T: AsRef<str> + Clone + Send + Sync + 'static,
{
    #[inline]
    fn key<'a>(&self, request: &'a Request<B>) -> Option<Key<'a>> {
        request
            .extensions()
            .get::<T>()
            .map(|t| Key::from(t.as_ref()))
    }
}

/// Keys by a function of the request. See [`from_fn`].
#[derive(Clone, Copy)]
pub struct FromFn<F>(F);

impl<F> fmt::Debug for FromFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FromFn").finish_non_exhaustive()
    }
}

/// Keys by a closure over the request; return a borrowed key where you can.
///
/// ```
/// use tower_circuit_breaker::keyed::{from_fn, Key, KeyFn};
///
/// // Model and region, from the path and a header.
/// let key = from_fn(|req: &http::Request<()>| {
///     let region = req.headers().get("x-region")?.to_str().ok()?;
///     Some(Key::from(format!("{}/{region}", req.uri().path().trim_start_matches('/'))))
/// });
/// let req = http::Request::get("/gpt-4o").header("x-region", "eu").body(()).unwrap();
/// assert_eq!(key.key(&req).unwrap().as_str(), "gpt-4o/eu");
/// ```
pub fn from_fn<Req, F>(f: F) -> FromFn<F>
where
    F: for<'a> Fn(&'a Req) -> Option<Key<'a>>,
{
    FromFn(f)
}

impl<Req, F> KeyFn<Req> for FromFn<F>
where
    F: for<'a> Fn(&'a Req) -> Option<Key<'a>>,
{
    #[inline]
    fn key<'a>(&self, request: &'a Req) -> Option<Key<'a>> {
        (self.0)(request)
    }
}
