//! One TLS record per gathered write: HTTPS connections hand their
//! gathered writes to OpenSSL as one buffer.
//!
//! HTTP/2 writes a response's frames through `poll_write_vectored`: its
//! own buffer (the HEADERS frame, the DATA frame's header and, `h2` filling
//! it up to 256 bytes, the payload's first bytes) and the rest of the
//! payload chained after it; HTTP/1.1 a chunked body likewise (size line,
//! data, CRLF). Over TLS that reaches OpenSSL's `SSL_write`, which takes
//! one buffer: the TLS stream writes only the first slice of a gathered
//! write, so a page left as two TLS records (three for a chunk) and as many
//! `write` calls. [`Coalesced`] copies the slices, whole and up to one
//! record's worth ([`RECORD_PAYLOAD`]), into one buffer first. Copying a
//! page costs less than the record and the system call it saves. A
//! full-size DATA frame still leaves as two records (its head part, then
//! the rest of its 16 KiB), as before.
//!
//! [`CoalescedApp`] wraps the proxy service and puts each TLS connection in
//! a [`Coalesced`] as it arrives; plain TCP keeps its own gathered writes
//! (`writev`), which it does in one call already.
//!
//! A write OpenSSL could not finish (`WouldBlock`) must be retried with at
//! least the same bytes from the same start (the listener's context
//! accepts a moved buffer, `SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER`). The
//! callers retry with the same slices, or with their last slice grown
//! (`h2` adding frames to its buffer), and [`gather`] takes slices in
//! order and whole, so the retried buffer starts with the same bytes and
//! is no shorter.

use std::cell::RefCell;
use std::fmt;
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::tls::{SslDigest, TlsRef};
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream,
    TimingDigest, UniqueID, UniqueIDType, ALPN,
};
use pingora::server::ShutdownWatch;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The most plaintext one TLS record carries (RFC 8446, 5.1).
pub const RECORD_PAYLOAD: usize = 16 * 1024;

/// A proxy service whose TLS connections write through [`Coalesced`].
pub struct CoalescedApp<A> {
    inner: Arc<A>,
}

impl<A> CoalescedApp<A> {
    pub fn new(inner: A) -> Self {
        Self {
            inner: Arc::new(inner),
        }
    }
}

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> ServerApp for CoalescedApp<A> {
    async fn process_new(
        self: &Arc<Self>,
        session: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        // A kept-alive HTTP/1.1 connection comes back already wrapped.
        let session = if session.get_ssl().is_some() && !session.as_any().is::<Coalesced>() {
            Box::new(Coalesced::new(session))
        } else {
            session
        };
        self.inner.process_new(session, shutdown).await
    }

    async fn cleanup(&self) {
        self.inner.cleanup().await;
    }
}

/// A TLS stream whose gathered writes reach OpenSSL as one buffer.
pub struct Coalesced {
    inner: Stream,
}

impl Coalesced {
    pub fn new(inner: Stream) -> Self {
        Self { inner }
    }
}

thread_local! {
    /// One buffer per worker thread for every gathered write made on it:
    /// OpenSSL encrypts what it is handed into its own record buffer, so
    /// nothing of it outlives the call, and an idle connection holds none.
    static GATHERED: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(RECORD_PAYLOAD));
}

impl fmt::Debug for Coalesced {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Coalesced").field(&self.inner).finish()
    }
}

impl AsyncWrite for Coalesced {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let inner = &mut self.get_mut().inner;
        GATHERED.with(|cell| {
            // Never borrowed twice (a TLS stream's write does not reach
            // another on its thread); were it, a buffer of this write's own
            // would serve instead.
            let mut spare = Vec::new();
            let mut held = cell.try_borrow_mut();
            let gathered = held.as_deref_mut().unwrap_or(&mut spare);
            let one = gather(bufs, gathered);
            if one.is_empty() {
                return Poll::Ready(Ok(0));
            }
            Pin::new(inner).poll_write(cx, one)
        })
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// What one gathered write hands OpenSSL: the first non-empty slice and
/// the slices after it that fit whole in one record, copied into
/// `gathered`; the first slice as it is when no other fits with it.
fn gather<'a>(bufs: &'a [IoSlice<'a>], gathered: &'a mut Vec<u8>) -> &'a [u8] {
    let mut slices = bufs.iter().filter(|b| !b.is_empty()).peekable();
    let Some(first) = slices.next() else {
        return &[];
    };
    // Whole slices only: cutting one would leave its tail a record of its
    // own.
    let fits = |len: usize, slice: &IoSlice<'_>| len + slice.len() <= RECORD_PAYLOAD;
    if !slices.peek().is_some_and(|next| fits(first.len(), next)) {
        return first;
    }
    gathered.clear();
    gathered.extend_from_slice(first);
    for slice in slices {
        if !fits(gathered.len(), slice) {
            break;
        }
        gathered.extend_from_slice(slice);
    }
    gathered
}

impl AsyncRead for Coalesced {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

// Everything else is the TLS stream's own.

#[async_trait]
impl Shutdown for Coalesced {
    async fn shutdown(&mut self) {
        self.inner.shutdown().await;
    }
}

impl UniqueID for Coalesced {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for Coalesced {
    fn get_ssl(&self) -> Option<&TlsRef> {
        self.inner.get_ssl()
    }

    fn get_ssl_digest(&self) -> Option<Arc<SslDigest>> {
        self.inner.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for Coalesced {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }

    fn get_read_pending_time(&self) -> Duration {
        self.inner.get_read_pending_time()
    }

    fn get_write_pending_time(&self) -> Duration {
        self.inner.get_write_pending_time()
    }
}

impl GetProxyDigest for Coalesced {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }

    fn set_proxy_digest(&mut self, digest: ProxyDigest) {
        self.inner.set_proxy_digest(digest);
    }
}

impl GetSocketDigest for Coalesced {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }

    fn set_socket_digest(&mut self, digest: SocketDigest) {
        self.inner.set_socket_digest(digest);
    }
}

#[async_trait]
impl Peek for Coalesced {
    async fn try_peek(&mut self, buf: &mut [u8]) -> std::io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;

    use tokio_test::io::Builder;

    use super::*;

    /// What [`gather`] hands OpenSSL for slices of these lengths.
    fn gathered_len(lens: &[usize]) -> usize {
        let data: Vec<Vec<u8>> = lens.iter().map(|&n| vec![7u8; n]).collect();
        let bufs: Vec<IoSlice<'_>> = data.iter().map(|d| IoSlice::new(d)).collect();
        let mut gathered = Vec::new();
        gather(&bufs, &mut gathered).len()
    }

    #[tokio::test]
    async fn a_frame_header_and_its_page_reach_the_tls_stream_as_one_write() {
        let header = [0u8; 9];
        let page = vec![b'p'; 6_700];
        let whole = [&header[..], &page[..]].concat();
        let mut stream = Coalesced::new(Box::new(Builder::new().write(&whole).build()));
        let bufs = [
            IoSlice::new(&header),
            IoSlice::new(&[]),
            IoSlice::new(&page),
        ];
        let written = poll_fn(|cx| Pin::new(&mut stream).poll_write_vectored(cx, &bufs))
            .await
            .unwrap();
        assert_eq!(
            written,
            whole.len(),
            "one write took the header and the page"
        );
    }

    #[tokio::test]
    async fn a_write_retried_after_pending_hands_the_tls_stream_the_same_bytes() {
        let header = [3u8; 100];
        let page = vec![b'q'; 2_000];
        let whole = [&header[..], &page[..]].concat();
        let stream = Builder::new()
            .wait(std::time::Duration::from_millis(5))
            .write(&whole)
            .build();
        let mut stream = Coalesced::new(Box::new(stream));
        let bufs = [IoSlice::new(&header), IoSlice::new(&page)];
        let mut pending = 0;
        let written = poll_fn(|cx| {
            let polled = Pin::new(&mut stream).poll_write_vectored(cx, &bufs);
            pending += usize::from(polled.is_pending());
            polled
        })
        .await
        .unwrap();
        assert_eq!(pending, 1, "the first attempt waited");
        assert_eq!(written, whole.len());
    }

    #[test]
    fn a_slice_that_goes_alone_is_handed_over_without_a_copy() {
        let body = vec![5u8; 300];
        let big = vec![6u8; RECORD_PAYLOAD];
        let mut gathered = Vec::new();
        for bufs in [
            vec![IoSlice::new(&body)],
            vec![IoSlice::new(&[]), IoSlice::new(&body), IoSlice::new(&big)],
        ] {
            let handed = gather(&bufs, &mut gathered);
            assert_eq!(handed.as_ptr(), body.as_ptr());
            assert_eq!(handed.len(), body.len());
        }
    }

    #[test]
    fn slices_are_gathered_whole_up_to_one_record_and_never_cut() {
        assert_eq!(gathered_len(&[9, 6_700]), 6_709);
        assert_eq!(gathered_len(&[9, 100, 6_700]), 6_809);
        // Exactly one record's worth is taken whole.
        assert_eq!(gathered_len(&[9, RECORD_PAYLOAD - 9]), RECORD_PAYLOAD);
        // The payload would overflow the record: the header goes alone,
        // the payload next, as a record of its own.
        assert_eq!(gathered_len(&[9, RECORD_PAYLOAD - 8]), 9);
        // In order: a later slice that would fit is not taken past one that
        // does not.
        assert_eq!(gathered_len(&[9, RECORD_PAYLOAD, 3]), 9);
        // A first slice that fills a record, or that goes alone, is written
        // as it is.
        assert_eq!(gathered_len(&[RECORD_PAYLOAD + 10, 5]), RECORD_PAYLOAD + 10);
        assert_eq!(gathered_len(&[0, 300, 0]), 300);
        assert_eq!(gathered_len(&[0, 0]), 0);
    }
}
