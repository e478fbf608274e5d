//! Taking a breaker key from a request.

use std::fmt;
use std::marker::PhantomData;

use http::header::HeaderName;
use http::Request;

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
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Borrowed(s) => s,
            // Only ever filled with ASCII by `hashed`.
            Repr::Inline { buf, len } => {
                std::str::from_utf8(&buf[..usize::from(*len)]).unwrap_or("")
            }
            Repr::Owned(s) => s,
        }
    }

    /// A key that stands for a secret (an API key, to gate one account's
    /// quota) without revealing it: `#` and 16 hex digits of a 64-bit FNV-1a
    /// hash, the same on every replica. Events, errors and snapshots only
    /// ever show this form.
    ///
    /// ```
    /// use tower_circuit_breaker::keyed::Key;
    ///
    /// let k = Key::hashed(b"sk-live-0123456789");
    /// assert_eq!(k.as_str().len(), 17);
    /// assert!(!k.as_str().contains("sk-live"));
    /// assert_eq!(k.as_str(), Key::hashed(b"sk-live-0123456789").as_str());
    /// ```
    pub fn hashed(secret: &[u8]) -> Key<'static> {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in secret {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        let mut buf = [0u8; 23];
        buf[0] = b'#';
        for i in 0..16 {
            let nibble = ((h >> (60 - 4 * i)) & 0xf) as u8;
            buf[1 + i] = b"0123456789abcdef"[usize::from(nibble)];
        }
        Key(Repr::Inline { buf, len: 17 })
    }
}

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
/// # Panics
///
/// If `name` is not a valid header name; this happens when the layer is
/// built, never per request.
pub fn header(name: &'static str) -> Header {
    Header(HeaderName::from_static(name))
}

impl<B> KeyFn<Request<B>> for Header {
    #[inline]
    fn key<'a>(&self, request: &'a Request<B>) -> Option<Key<'a>> {
        request.headers().get(&self.0)?.to_str().ok().map(Key::from)
    }
}

/// Keys by a hash of a header's value, for credentials. See
/// [`header_hashed`].
#[derive(Debug, Clone)]
pub struct HashedHeader(HeaderName);

/// Keys by a hash of a header's value (`authorization`, `x-api-key`), so that
/// one account's breaker is separate from another's while the secret never
/// appears in a key, an event, an error or a snapshot (see [`Key::hashed`]).
///
/// # Panics
///
/// If `name` is not a valid header name.
pub fn header_hashed(name: &'static str) -> HashedHeader {
    HashedHeader(HeaderName::from_static(name))
}

impl<B> KeyFn<Request<B>> for HashedHeader {
    #[inline]
    fn key<'a>(&self, request: &'a Request<B>) -> Option<Key<'a>> {
        request
            .headers()
            .get(&self.0)
            .map(|v| Key::hashed(v.as_bytes()))
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
