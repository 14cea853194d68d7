//! The HTTP/1 server under the application: binding (loopback unless callers must
//! authenticate, and plain HTTP only there unless allowed), our own accept loop on hyper
//! (TCP_NODELAY, the TLS handshake inside each connection's task with its own timeout, a
//! header timeout, no stop held up by idle or slow clients) and the graceful stop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use tokio_util::sync::CancellationToken;

use super::tls_listener::TlsListener;

/// Why the server will not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(
        "refusing to listen on {0}: a non-loopback address needs bearer tokens (auth.tokens_file or FIELDGATE_TOKEN_<NAME>) or [server.oauth]"
    )]
    OpenToNetwork(SocketAddr),
    #[error(
        "refusing to listen on {0} without TLS: set [server.tls] (docs/security.md), or server.allow_plaintext = true behind a TLS-terminating proxy"
    )]
    Plaintext(SocketAddr),
    #[error(
        "cannot listen on {addr}: {source} (is another program using it? choose another address with --listen or server.listen)"
    )]
    Bind { addr: SocketAddr, source: std::io::Error },
}

/// How a listener is protected, for [`bind`]'s checks.
#[derive(Debug, Clone, Copy)]
pub struct Exposure {
    /// Callers must present a bearer token (static or OAuth).
    pub authenticated: bool,
    pub tls: bool,
    /// `server.allow_plaintext`.
    pub allow_plaintext: bool,
}

/// Checks the listen address against its protection and binds it: off loopback, callers
/// authenticate, over TLS unless plain HTTP is allowed explicitly.
pub async fn bind(listen: SocketAddr, exposure: Exposure) -> Result<tokio::net::TcpListener, ServeError> {
    if let Some(refused) = exposure_refusal(listen, exposure) {
        return Err(refused);
    }
    tokio::net::TcpListener::bind(listen).await.map_err(|source| ServeError::Bind { addr: listen, source })
}

/// Why `listen` may not be served with `exposure` (`fieldgate check` says it too).
pub fn exposure_refusal(listen: SocketAddr, exposure: Exposure) -> Option<ServeError> {
    if listen.ip().is_loopback() {
        None
    } else if !exposure.authenticated {
        Some(ServeError::OpenToNetwork(listen))
    } else if !exposure.tls && !exposure.allow_plaintext {
        Some(ServeError::Plaintext(listen))
    } else {
        None
    }
}

/// Serves `app` on `listener` until `stop`, then lets requests in flight finish within
/// `grace`. Every accepted socket gets TCP_NODELAY (small answers go out at once, not
/// behind a client's delayed ACK), and a connection whose request headers are not
/// complete within `header_timeout` of their start (or of its last answer, when kept
/// alive) is closed, so slow or idle clients cannot hold connections open.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
    timeouts: Timeouts,
    shutdown: CancellationToken,
    tls: Option<Arc<TlsListener>>,
) -> std::io::Result<()> {
    use hyper_util::rt::TokioTimer;
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1.timer(TokioTimer::new()).header_read_timeout(timeouts.header);
    let connections = tokio_util::task::TaskTracker::new();
    let stopping = CancellationToken::new();
    tokio::pin!(stop);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(error) => {
                    // Out of file descriptors or similar: wait a moment, keep serving.
                    tracing::warn!(%error, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let _ = stream.set_nodelay(true);
        let (http1, app, stopping) = (http1.clone(), app.clone(), stopping.clone());
        connections.spawn(accepted(http1, stream, app, stopping, Peer(peer.ip()), tls.clone()));
    }
    drop(listener);
    shutdown.cancel();
    stopping.cancel();
    connections.close();
    tokio::select! {
        () = connections.wait() => {}
        () = tokio::time::sleep(timeouts.grace) => {
            tracing::warn!(grace_ms = timeouts.grace.as_millis() as u64, "requests still running after the grace period; stopping");
        }
    }
    Ok(())
}

/// The address a request came from (for limits that are per address).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Peer(pub std::net::IpAddr);

/// Closes the connection a request came on, whatever it is doing (a long-lived answer
/// that has to end now, even to a client that stopped reading).
#[derive(Debug, Clone)]
pub struct Hangup(CancellationToken);

impl Hangup {
    pub fn now(&self) {
        self.0.cancel();
    }

    /// A hangup no connection listens to (requests made in-process).
    pub fn detached() -> Hangup {
        Hangup(CancellationToken::new())
    }
}

/// An accepted socket: its TLS handshake first when the listener has TLS (a client that
/// never finishes one is dropped after the handshake timeout, or at stop), then HTTP.
async fn accepted(
    http1: hyper::server::conn::http1::Builder,
    stream: tokio::net::TcpStream,
    app: Router,
    stopping: CancellationToken,
    peer: Peer,
    tls: Option<Arc<TlsListener>>,
) {
    use super::head_refusal::EnvelopeIo;
    use hyper_util::rt::TokioIo;
    let Some(tls) = tls else {
        return connection(http1, TokioIo::new(EnvelopeIo::new(stream)), app, stopping, peer).await;
    };
    // Plain HTTP to the HTTPS port (a request line, not a TLS record): told so, in HTTP.
    let mut first = [0u8; 1];
    let peeked = tokio::select! {
        p = tokio::time::timeout(tls.handshake_timeout(), stream.peek(&mut first)) => p,
        () = stopping.cancelled() => return,
    };
    if !matches!(peeked, Ok(Ok(1))) {
        // Nothing sent within the handshake's time, or the connection closed.
        tls.handshake_failed();
        return;
    }
    if first[0].is_ascii_uppercase() {
        use tokio::io::AsyncWriteExt;
        tls.handshake_failed();
        let mut stream = stream;
        let text = "This port speaks HTTPS: use https://\n";
        let answer = format!(
            "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
            text.len()
        );
        let _ = tokio::time::timeout(tls.handshake_timeout(), stream.write_all(answer.as_bytes())).await;
        return;
    }
    let handshake = tokio::time::timeout(tls.handshake_timeout(), tls.acceptor().accept(stream));
    let stream = tokio::select! {
        done = handshake => match done {
            Ok(Ok(s)) => s,
            Ok(Err(error)) => {
                tls.handshake_failed();
                tracing::debug!(%error, "TLS handshake failed");
                return;
            }
            Err(_) => {
                tls.handshake_failed();
                tracing::debug!("TLS handshake not finished in time");
                return;
            }
        },
        () = stopping.cancelled() => return,
    };
    connection(http1, TokioIo::new(EnvelopeIo::new(stream)), app, stopping, peer).await
}

/// Serves one connection. On stop, a connection with no request in flight (idle, or a
/// client still sending headers) is closed at once; one with a request finishes it first.
async fn connection<S>(
    http1: hyper::server::conn::http1::Builder,
    io: hyper_util::rt::TokioIo<super::head_refusal::EnvelopeIo<S>>,
    app: Router,
    stopping: CancellationToken,
    peer: Peer,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::ServiceExt;
    let busy = Arc::new(AtomicUsize::new(0));
    let in_flight = busy.clone();
    let hangup = CancellationToken::new();
    let handle = Hangup(hangup.clone());
    let service = hyper::service::service_fn(move |mut req: Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(peer);
        req.extensions_mut().insert(handle.clone());
        in_flight.fetch_add(1, Ordering::SeqCst);
        let done = in_flight.clone();
        let answer = app.clone().oneshot(req.map(Body::new));
        async move {
            let response = answer.await;
            done.fetch_sub(1, Ordering::SeqCst);
            response
        }
    });
    let conn = http1.serve_connection(io, service);
    tokio::pin!(conn);
    tokio::select! {
        ended = conn.as_mut() => {
            if let Err(error) = ended {
                tracing::debug!(%error, "connection ended with an error");
            }
        }
        // Dropping the connection closes its socket at once.
        () = hangup.cancelled() => {}
        () = stopping.cancelled() => {
            if busy.load(Ordering::SeqCst) > 0 {
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
        }
    }
}

/// How long a server waits: for request headers, and for requests in flight on stop.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub header: Duration,
    pub grace: Duration,
}

impl Timeouts {
    pub fn of(config: &crate::config::ServerConfig) -> Timeouts {
        Timeouts {
            header: Duration::from_millis(config.header_timeout_ms),
            grace: Duration::from_millis(config.shutdown_grace_ms),
        }
    }
}
