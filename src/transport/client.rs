//! A minimal HTTP/1.1 client with keep-alive, for the demo tour, tests and benchmarks.
//! It speaks only what fieldgate's server sends: `Content-Length` or chunked bodies.

use std::net::SocketAddr;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
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

/// One keep-alive connection.
pub struct HttpClient {
    stream: BufReader<TcpStream>,
    host: String,
    token: Option<String>,
}

fn bad(msg: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg.to_string())
}

impl HttpClient {
    pub async fn connect(addr: SocketAddr) -> std::io::Result<HttpClient> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(HttpClient { stream: BufReader::new(stream), host: addr.to_string(), token: None })
    }

    pub fn with_token(mut self, token: &str) -> Self {
        self.token = Some(token.to_string());
        self
    }

    /// Sends a request with extra headers and reads the whole response.
    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<HttpResponse> {
        let mut req = format!("{method} {path} HTTP/1.1\r\ncontent-length: {}\r\n", body.len());
        // An explicit Host header (tests of DNS rebinding) replaces the default.
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
            req.push_str(&format!("host: {}\r\n", self.host));
        }
        if !body.is_empty() {
            req.push_str("content-type: application/json\r\n");
        }
        if let Some(t) = &self.token {
            req.push_str(&format!("authorization: Bearer {t}\r\n"));
        }
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        let s = self.stream.get_mut();
        s.write_all(req.as_bytes()).await?;
        s.write_all(body).await?;
        self.read_response().await
    }

    pub async fn get(&mut self, path: &str) -> std::io::Result<HttpResponse> {
        self.send("GET", path, &[], b"").await
    }

    pub async fn post(&mut self, path: &str, body: &[u8]) -> std::io::Result<HttpResponse> {
        self.send("POST", path, &[], body).await
    }

    async fn read_response(&mut self) -> std::io::Result<HttpResponse> {
        let mut line = String::new();
        self.stream.read_line(&mut line).await?;
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("no status line"))?;
        let mut headers = Vec::new();
        loop {
            line.clear();
            if self.stream.read_line(&mut line).await? == 0 {
                return Err(bad("connection closed in headers"));
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
        let find =
            |name: &str| headers.iter().find(|(k, _)| k == name).map(|(_, v): &(String, String)| v.clone());
        let mut body = Vec::new();
        if let Some(n) = find("content-length").and_then(|v| v.parse::<usize>().ok()) {
            body.resize(n, 0);
            self.stream.read_exact(&mut body).await?;
        } else if find("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
            loop {
                line.clear();
                self.stream.read_line(&mut line).await?;
                let size = usize::from_str_radix(line.trim(), 16).map_err(|_| bad("bad chunk size"))?;
                let mut chunk = vec![0; size + 2];
                self.stream.read_exact(&mut chunk).await?;
                if size == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..size]);
            }
        }
        Ok(HttpResponse { status, headers, body })
    }
}
