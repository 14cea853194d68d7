//! One keep-alive HTTP/1.1 connection to fieldgate's own API (hyper's client connection),
//! for the CLI, the stdio relay, the demo tour, tests and benchmarks: requests go out in
//! turn on that connection, and each answer is read to its end. (The work-order webhook
//! uses reqwest, with TLS: `work_orders/webhook.rs`.)

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderName, HeaderValue};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// A response: status, headers (lower-case names) and body.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_default()
    }
}

/// How long a request waits for its whole answer unless told otherwise.
pub const TIMEOUT: Duration = Duration::from_secs(120);

/// One keep-alive connection.
pub struct HttpClient {
    sender: SendRequest<Full<Bytes>>,
    host: String,
    token: Option<String>,
    timeout: Duration,
}

fn io_error(e: impl std::error::Error + Send + Sync + 'static) -> std::io::Error {
    std::io::Error::other(e)
}

impl HttpClient {
    pub async fn connect(addr: SocketAddr) -> std::io::Result<HttpClient> {
        let late = || {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("{addr} did not accept within {} s", TIMEOUT.as_secs()),
            )
        };
        let stream = tokio::time::timeout(TIMEOUT, TcpStream::connect(addr)).await.map_err(|_| late())??;
        stream.set_nodelay(true)?;
        HttpClient::over(stream, addr.to_string()).await
    }

    /// A client over a connection already made (a TLS stream, say), sending `Host: host`.
    pub async fn over<S>(stream: S, host: String) -> std::io::Result<HttpClient>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(io_error)?;
        // Drives the connection until it closes (by either side, or when the client is dropped).
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(HttpClient { sender, host, token: None, timeout: TIMEOUT })
    }

    /// Requests wait at most `timeout` for their whole answer (default [`TIMEOUT`]).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    pub fn with_token(mut self, token: &str) -> Self {
        self.token = Some(token.to_string());
        self
    }

    /// Sends a request with extra headers and reads the whole response. Headers are sent
    /// as given, after fieldgate's defaults (a `Host` given replaces the default one).
    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<HttpResponse> {
        let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, what.to_string());
        let mut request = hyper::Request::builder()
            .method(method.as_bytes())
            .uri(path)
            .body(Full::new(Bytes::copy_from_slice(body)))
            .map_err(io_error)?;
        let map = request.headers_mut();
        let mut add = |k: &str, v: &str| -> std::io::Result<()> {
            let name = HeaderName::from_bytes(k.as_bytes()).map_err(|_| bad("a header name"))?;
            let value = HeaderValue::from_bytes(v.as_bytes()).map_err(|_| bad("a header value"))?;
            map.append(name, value);
            Ok(())
        };
        add("content-length", &body.len().to_string())?;
        // An explicit Host header (tests of DNS rebinding) replaces the default.
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
            add("host", &self.host)?;
        }
        if !body.is_empty() {
            add("content-type", "application/json")?;
        }
        if let Some(t) = &self.token {
            add("authorization", &format!("Bearer {t}"))
                .map_err(|_| bad("the token cannot be sent: it holds a line break or a control character"))?;
        }
        for (k, v) in headers {
            add(k, v)?;
        }
        let exchange = async {
            self.sender.ready().await.map_err(io_error)?;
            let response = self.sender.send_request(request).await.map_err(io_error)?;
            let (parts, body) = response.into_parts();
            let body = body.collect().await.map_err(io_error)?.to_bytes().to_vec();
            Ok::<_, std::io::Error>((parts, body))
        };
        let (parts, body) = tokio::time::timeout(self.timeout, exchange).await.map_err(|_| {
            let message = format!("no answer to {method} {path} within {} s", self.timeout.as_secs_f64());
            std::io::Error::new(std::io::ErrorKind::TimedOut, message)
        })??;
        let headers = parts
            .headers
            .iter()
            .map(|(k, v)| (k.as_str().to_string(), String::from_utf8_lossy(v.as_bytes()).trim().to_string()))
            .collect();
        Ok(HttpResponse { status: parts.status.as_u16(), headers, body })
    }

    pub async fn get(&mut self, path: &str) -> std::io::Result<HttpResponse> {
        self.send("GET", path, &[], b"").await
    }

    pub async fn post(&mut self, path: &str, body: &[u8]) -> std::io::Result<HttpResponse> {
        self.send("POST", path, &[], body).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that takes the connection and never answers: the request fails as a
    /// timeout that names it, rather than waiting for ever.
    #[tokio::test(start_paused = true)]
    async fn a_server_that_never_answers_is_a_timeout_naming_the_request() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _silent = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            std::future::pending::<()>().await;
            drop(socket);
        });
        let mut c = HttpClient::connect(addr).await.unwrap().with_timeout(Duration::from_secs(5));
        let e = c.get("/v1/tools").await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        assert_eq!(e.to_string(), "no answer to GET /v1/tools within 5 s");
    }
}
