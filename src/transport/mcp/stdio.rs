//! MCP over stdin/stdout: our line framing in front of rmcp's service loop.
//!
//! rmcp's own line transport skips unparsable lines and answers invalid ones without
//! their id, so a client that sent one waits forever. Here each line is framed first
//! (`jsonrpc::frame`): what is not a JSON-RPC message is answered at once (`-32700` with
//! `id: null`, or `-32600` with the id as sent) and logged on stderr; only messages rmcp
//! can read reach it. Every write to stdout, rmcp's answers and ours, goes through one
//! writer task, so an answer is never cut by another or by a cancelled read.

use parking_lot::Mutex;
use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rmcp::RoleServer;
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, GetMeta, ProtocolVersion, ServerJsonRpcMessage};
use rmcp::service::ServiceExt;
use rmcp::transport::Transport;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

use super::McpServer;
use super::jsonrpc::{self, Kind, Reject};

/// What came in, for the exit status: a peer that sent only refused input never spoke MCP.
#[derive(Default)]
struct Tally {
    accepted: AtomicU64,
    refused: AtomicU64,
    first_refusal: Mutex<Option<String>>,
}

impl Tally {
    fn refuse(&self, r: &Reject) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            code = r.code,
            id = r.id.as_deref().unwrap_or("null"),
            "MCP message refused: {}",
            r.message
        );
        let mut first = self.first_refusal.lock();
        if first.is_none() {
            *first = Some(format!("{} ({})", r.message, r.code));
        }
    }
}

/// Lines of at most `max` bytes from a byte stream (a longer one is reported, and the
/// rest of it skipped). Bytes, not text: a line that is not UTF-8 is still a line, to be
/// answered.
pub(crate) struct LineReader<R> {
    read: BufReader<R>,
    pub(crate) line: Vec<u8>,
    pub(crate) max: usize,
    /// Dropping the rest of a line longer than `max`.
    discarding: bool,
}

/// What [`LineReader::next`] found.
pub(crate) enum Read {
    /// A whole line is in `line`.
    Line,
    /// A line longer than `max`: dropped.
    Oversized,
    /// The end of the stream (what is in `line` has no newline).
    Eof,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    pub(crate) fn new(read: R, max: usize) -> LineReader<R> {
        LineReader { read: BufReader::new(read), line: Vec::new(), max, discarding: false }
    }

    /// One line into `line`, never longer than `max`. Cancel-safe: a partial line stays
    /// in `line` and the next call goes on with it.
    pub(crate) async fn next(&mut self) -> std::io::Result<Read> {
        loop {
            let available = self.read.fill_buf().await?;
            if available.is_empty() {
                return Ok(Read::Eof);
            }
            let newline = available.iter().position(|b| *b == b'\n');
            let take = newline.map_or(available.len(), |i| i + 1);
            let step = if self.discarding {
                if newline.is_some() {
                    self.discarding = false;
                }
                None
            } else if self.line.len() + take > self.max + 2 {
                self.line.clear();
                self.discarding = newline.is_none();
                Some(Read::Oversized)
            } else {
                self.line.extend_from_slice(&available[..take]);
                newline.map(|_| Read::Line)
            };
            self.read.consume(take);
            if let Some(step) = step {
                return Ok(step);
            }
        }
    }
}

/// The line transport rmcp runs on.
struct Lines<R> {
    reader: LineReader<R>,
    eof: bool,
    /// An answer of ours waiting for room in the writer's queue.
    pending: Option<Vec<u8>>,
    out: mpsc::Sender<Vec<u8>>,
    /// rmcp has left its initialization phase (where a notification ends the service):
    /// an `initialize`, or a request with 2026-07-28 metadata, has been passed on.
    started: bool,
    tally: Arc<Tally>,
}

impl<R: AsyncRead + Unpin + Send> Lines<R> {
    /// What to do with the line in `self.line`: a message for rmcp, or nothing (an
    /// answer of ours may be pending).
    fn take_line(&mut self) -> Option<ClientJsonRpcMessage> {
        let line = std::mem::take(&mut self.reader.line);
        let mut text: &[u8] = &line;
        while let Some(rest) = text.strip_suffix(b"\n").or_else(|| text.strip_suffix(b"\r")) {
            text = rest;
        }
        let message = if text.iter().all(u8::is_ascii_whitespace) { None } else { self.decode(text) };
        // Keep the buffer's room for the next line.
        self.reader.line = line;
        self.reader.line.clear();
        message
    }

    fn decode(&mut self, text: &[u8]) -> Option<ClientJsonRpcMessage> {
        let frame = match jsonrpc::frame(text) {
            Ok(f) => f,
            Err(r) => {
                self.answer(r);
                return None;
            }
        };
        match serde_json::from_slice::<ClientJsonRpcMessage>(text) {
            Ok(message) => {
                self.tally.accepted.fetch_add(1, Ordering::Relaxed);
                if !self.started {
                    match frame.kind {
                        // rmcp's initialization phase takes requests only; anything else
                        // there would end the service.
                        Kind::Notification | Kind::Response => {
                            tracing::debug!(method = frame.method, "message before initialization ignored");
                            return None;
                        }
                        Kind::Request => self.started = starts_lifecycle(&message),
                    }
                }
                Some(message)
            }
            Err(e) if frame.kind == Kind::Request => {
                self.answer(jsonrpc::unreadable(&frame, &e));
                None
            }
            // Notifications are never answered, responses have nobody to answer.
            Err(e) => {
                self.tally.refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(method = frame.method, "MCP message ignored: {e}");
                None
            }
        }
    }

    fn answer(&mut self, r: Reject) {
        self.tally.refuse(&r);
        let mut line = r.to_json();
        line.push(b'\n');
        self.pending = Some(line);
    }
}

/// Whether rmcp leaves its initialization phase with this request: `initialize`, or a
/// request (not discovery or ping) with complete 2026-07-28 metadata naming a version we
/// serve (rmcp answers any other with an error and stays in the phase).
fn starts_lifecycle(message: &ClientJsonRpcMessage) -> bool {
    let ClientJsonRpcMessage::Request(req) = message else { return false };
    match &req.request {
        ClientRequest::InitializeRequest(_) => true,
        ClientRequest::DiscoverRequest(_) | ClientRequest::PingRequest(_) => false,
        request => {
            let meta = request.get_meta();
            meta.missing_required_keys(&ProtocolVersion::V_2026_07_28).is_empty()
                && meta.protocol_version().is_some_and(|v| super::VERSIONS.contains(&v))
        }
    }
}

impl<R: AsyncRead + Unpin + Send> Transport<RoleServer> for Lines<R> {
    type Error = std::io::Error;

    fn name() -> Cow<'static, str> {
        "fieldgate-stdio".into()
    }

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let out = self.out.clone();
        let line = serde_json::to_vec(&item).map(|mut v| {
            v.push(b'\n');
            v
        });
        async move {
            let line = line.map_err(std::io::Error::other)?;
            out.send(line).await.map_err(|_| std::io::Error::from(std::io::ErrorKind::BrokenPipe))
        }
    }

    async fn receive(&mut self) -> Option<ClientJsonRpcMessage> {
        loop {
            if self.pending.is_some() {
                // Cancel-safe: the answer stays pending until there is room for it.
                let permit = self.out.reserve().await.ok()?;
                if let Some(line) = self.pending.take() {
                    permit.send(line);
                }
            }
            if self.eof {
                return None;
            }
            match self.reader.next().await {
                Ok(Read::Line) => {}
                Ok(Read::Oversized) => {
                    self.answer(Reject::invalid(
                        format!(
                            "Invalid Request: the message is longer than {} bytes (server.max_body_bytes)",
                            self.reader.max
                        ),
                        None,
                    ));
                    continue;
                }
                // A last line without a newline is still a message.
                Ok(Read::Eof) => self.eof = true,
                Err(e) => {
                    tracing::error!("cannot read stdin: {e}");
                    return None;
                }
            }
            if let Some(message) = self.take_line() {
                return Some(message);
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }
}

/// Serves `server` on `read`/`write` until the client closes its side; every answer is
/// written before this returns. An error when the peer sent only what was refused.
pub async fn serve_lines<R, W>(server: McpServer, read: R, write: W, max_line: usize) -> Result<(), String>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (out, mut queue) = mpsc::channel::<Vec<u8>>(64);
    let writer = tokio::spawn(async move {
        let mut write = write;
        while let Some(line) = queue.recv().await {
            if write.write_all(&line).await.is_err() {
                break;
            }
            if queue.is_empty() && write.flush().await.is_err() {
                break;
            }
        }
        let _ = write.flush().await;
    });
    let tally = Arc::new(Tally::default());
    let lines = Lines {
        reader: LineReader::new(read, max_line),
        eof: false,
        pending: None,
        out,
        started: false,
        tally: tally.clone(),
    };
    let served = match server.serve(lines).await {
        Ok(running) => running.waiting().await.map(|_| ()).map_err(|e| e.to_string()),
        // A client that only probed (server/discover) and left is not a failure.
        Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => Ok(()),
        Err(e) => Err(e.to_string()),
    };
    // Every answer reaches stdout before the process ends (bounded: a peer that stopped
    // reading cannot hold the exit).
    let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
    let refused = tally.refused.load(Ordering::Relaxed);
    if tally.accepted.load(Ordering::Relaxed) == 0 && refused > 0 {
        let first = tally.first_refusal.lock().take().unwrap_or_default();
        return Err(format!(
            "the peer never spoke MCP: {refused} message(s) refused, none accepted; the first: {first}"
        ));
    }
    served
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::Caller;

    /// Runs the server on in-memory pipes with `input`, returns stdout's lines and the result.
    async fn run(input: &[u8]) -> (Vec<String>, Result<(), String>) {
        let registry = crate::registry::Registry::load(
            &std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("devices"),
        )
        .expect("demo plant");
        let tools = crate::tools::ToolService::new(Arc::new(registry), crate::config::Config::default());
        let server = McpServer::new(tools, Caller::local());
        let (mut client_w, server_r) = tokio::io::duplex(1 << 20);
        let (server_w, mut client_r) = tokio::io::duplex(1 << 20);
        client_w.write_all(input).await.unwrap();
        drop(client_w);
        let served =
            tokio::time::timeout(Duration::from_secs(10), serve_lines(server, server_r, server_w, 65_536))
                .await
                .expect("ends at EOF");
        let mut out = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut client_r, &mut out).await.unwrap();
        (out.lines().map(str::to_string).collect(), served)
    }

    #[tokio::test]
    async fn garbage_only_is_answered_and_fails() {
        let (lines, served) = run(b"hello\n{\"jsonrpc\":\"2.0\",\"id\":1\n").await;
        assert_eq!(lines.len(), 2, "{lines:?}");
        for l in &lines {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            assert_eq!(v["error"]["code"], -32700, "{l}");
            assert!(v["id"].is_null());
        }
        assert!(served.unwrap_err().contains("never spoke MCP"));
    }

    #[tokio::test]
    async fn a_last_line_without_newline_is_answered() {
        let (lines, served) = run(br#"{"jsonrpc":"2.0","id":5,"method":"ping"}"#).await;
        assert_eq!(lines.len(), 1, "{lines:?}");
        let v: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
        assert_eq!(v["id"], 5);
        assert!(v["result"].is_object(), "{v}");
        assert!(served.is_ok());
    }

    #[tokio::test]
    async fn a_notification_before_initialize_does_not_end_the_service() {
        let input = concat!(
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
            "\n"
        );
        let (lines, served) = run(input.as_bytes()).await;
        assert!(served.is_ok(), "{served:?}");
        assert_eq!(lines.len(), 2, "{lines:?}");
        let v: serde_json::Value = serde_json::from_str(&lines[1]).unwrap();
        assert_eq!(
            v["result"]["tools"].as_array().map(Vec::len),
            Some(11),
            "{} tools",
            v["result"]["tools"].as_array().map_or(0, Vec::len)
        );
    }
}
