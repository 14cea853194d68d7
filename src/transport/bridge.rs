//! `fieldgate mcp` when another fieldgate holds the data directory: MCP messages from
//! stdin go to that service's `/mcp` (Streamable HTTP) and its answers back to stdout, so
//! several desktop clients share one running service. When the service is gone, every
//! request still gets an answer: a JSON-RPC error saying so. When no service can be
//! reached at all, [`refuse_stdio`] answers every request with why and what to run.

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::client::{HttpClient, HttpResponse};
use super::mcp::stdio::{LineReader, Read};

/// JSON-RPC "server error" for a request the bridge could not deliver.
const UNAVAILABLE: i64 = -32000;
/// Longest wait for the service's answer to one relayed message.
const RELAY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

fn error_line(id: &Value, message: &str) -> String {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": UNAVAILABLE, "message": message}}).to_string()
}

/// The id of a request line (`None` for notifications and what does not parse).
fn request_id(line: &str) -> Option<Value> {
    let v: Value = serde_json::from_str(line).ok()?;
    v.get("method")?;
    v.get("id").cloned()
}

/// The JSON-RPC messages of a `/mcp` response: a JSON body, or the `data` of each
/// server-sent event.
fn messages(r: &HttpResponse) -> Vec<String> {
    let body = String::from_utf8_lossy(&r.body);
    if r.header("content-type").is_some_and(|t| t.starts_with("text/event-stream")) {
        let mut out = Vec::new();
        let mut data = String::new();
        for line in body.lines() {
            if let Some(d) = line.strip_prefix("data:") {
                data.push_str(d.trim_start());
            } else if line.is_empty() && !data.is_empty() {
                out.push(std::mem::take(&mut data));
            }
        }
        if !data.is_empty() {
            out.push(data);
        }
        out
    } else if body.trim().is_empty() {
        Vec::new()
    } else {
        vec![body.trim().to_string()]
    }
}

/// Relays stdin to `url`'s `/mcp` until stdin closes.
pub async fn bridge_stdio(url: &str, token: Option<String>, max_line: usize) -> Result<(), String> {
    // The address of the service, with or without its `/mcp` (as HTTP clients are given it).
    let url = url.trim_end_matches('/').trim_end_matches("/mcp");
    let target = super::service_url::ServiceUrl::parse(url).map_err(|e| e.to_string())?;
    tracing::info!(%url, "relaying MCP over stdio to the running fieldgate");
    let mut lines = LineReader::new(tokio::io::stdin(), max_line);
    let mut stdout = tokio::io::stdout();
    let mut relay = Relay {
        target,
        url: url.to_string(),
        token,
        client: None,
        session: None,
        version: None,
        initialize: None,
        unreachable: None,
    };
    'relay: loop {
        // What cannot be relayed is answered here, as the service would: never silence.
        let line = match lines.next().await {
            Ok(Read::Eof) if lines.line.is_empty() => break 'relay,
            Ok(Read::Line | Read::Eof) => match String::from_utf8(std::mem::take(&mut lines.line)) {
                Ok(text) => text,
                Err(_) => {
                    let e = parse_error("Parse error: the message is not UTF-8");
                    if write_line(&mut stdout, &e).await.is_err() {
                        break 'relay;
                    }
                    continue;
                }
            },
            Ok(Read::Oversized) => {
                let e =
                    invalid_request(&format!("Invalid Request: the message is longer than {max_line} bytes"));
                if write_line(&mut stdout, &e).await.is_err() {
                    break 'relay;
                }
                continue;
            }
            Err(_) => break 'relay,
        };
        let line = line.trim_end_matches(['\n', '\r']);
        if line.trim().is_empty() {
            continue;
        }
        let id = request_id(line);
        let answer = relay.exchange(line).await;
        let out = relay.answers(answer, id.as_ref());
        for m in out {
            if write_line(&mut stdout, &m).await.is_err() {
                break 'relay;
            }
        }
    }
    relay.end().await;
    Ok(())
}

/// The relay's connection to the service and the MCP session it carries on.
struct Relay {
    target: super::service_url::ServiceUrl,
    url: String,
    token: Option<String>,
    client: Option<HttpClient>,
    session: Option<String>,
    version: Option<String>,
    /// The client's `initialize`, sent again when the service lost the session.
    initialize: Option<String>,
    /// Why the last connection could not be made, for the client's error.
    unreachable: Option<String>,
}

impl Relay {
    /// The client is gone: ends its session on the service (DELETE), so that the session
    /// does not count against the token until it expires. Bounded: a service that does not
    /// answer is left to expire it.
    async fn end(&mut self) {
        let (Some(session), Some(client)) = (self.session.take(), self.client.as_mut()) else { return };
        let headers = [("mcp-session-id", session.as_str())];
        let ended = tokio::time::timeout(
            std::time::Duration::from_secs(2),
            client.send("DELETE", "/mcp", &headers, b""),
        )
        .await;
        tracing::debug!(ended = ended.is_ok(), "relay: session ended");
    }

    /// Relays one message. When the service no longer knows the session (it restarted, or
    /// the session expired), a new one is opened with the client's own `initialize` and the
    /// message sent again: a stdio client cannot open one by itself.
    async fn exchange(&mut self, line: &str) -> Option<HttpResponse> {
        let method =
            serde_json::from_str::<Value>(line).ok().and_then(|v| v["method"].as_str().map(str::to_string));
        if method.as_deref() == Some("initialize") {
            self.initialize = Some(line.to_string());
            self.session = None;
        }
        let r = self.post(line).await?;
        let lost = r.status == 404 && self.session.is_some() && method.as_deref() != Some("initialize");
        let Some(init) = self.initialize.clone().filter(|_| lost) else { return Some(r) };
        self.session = None;
        let opened = self.post(&init).await.and_then(|a| a.header("mcp-session-id").map(str::to_string));
        let Some(session) = opened else { return Some(r) };
        tracing::info!(url = %self.url, "relay: the service no longer knew the session; a new one is open");
        self.session = Some(session);
        let _ = self.post(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).await;
        self.post(line).await
    }

    /// Posts one message to `/mcp`, reconnecting once (a keep-alive connection the service
    /// closed meanwhile). `None` when the service does not answer.
    async fn post(&mut self, line: &str) -> Option<HttpResponse> {
        let mut headers: Vec<(&str, &str)> =
            vec![("content-type", "application/json"), ("accept", "application/json, text/event-stream")];
        if let Some(s) = &self.session {
            headers.push(("mcp-session-id", s));
        }
        if let Some(v) = &self.version {
            headers.push(("mcp-protocol-version", v));
        }
        for _ in 0..2 {
            if self.client.is_none() {
                match self.target.connect().await {
                    Ok(c) => {
                        self.unreachable = None;
                        self.client = Some(match &self.token {
                            Some(t) => c.with_token(t),
                            None => c,
                        });
                    }
                    Err(e) => {
                        // Refused or not found: the service is not there (stopped). Anything
                        // else (a certificate not trusted) is worth the client's reading.
                        use super::service_url::ConnectError;
                        self.unreachable = match e {
                            ConnectError::Io { refused: true, .. } | ConnectError::Resolve(_) => None,
                            other => Some(other.to_string()),
                        };
                        return None;
                    }
                }
            }
            let c = self.client.as_mut()?;
            // A service that stopped answering (hung, paused) must not hold the client forever.
            match tokio::time::timeout(RELAY_TIMEOUT, c.send("POST", "/mcp", &headers, line.as_bytes())).await
            {
                Ok(Ok(r)) => return Some(r),
                Ok(Err(_)) => self.client = None,
                Err(_) => {
                    self.client = None;
                    return None;
                }
            }
        }
        None
    }

    /// The lines to write for the service's answer to the request `id` (none for a
    /// notification), remembering the session and protocol version it names.
    fn answers(&mut self, answer: Option<HttpResponse>, id: Option<&Value>) -> Vec<String> {
        let url = &self.url;
        let Some(r) = answer else {
            return match id {
                Some(id) => {
                    tracing::warn!(%url, "the service relayed to does not answer");
                    let message = match &self.unreachable {
                        // Why the connection failed (a certificate not trusted, refused).
                        Some(why) => format!("{why}; `fieldgate mcp` tries again with the next request"),
                        None => format!(
                            "the fieldgate service at {url} does not answer (stopped, hung or unreachable); restart `fieldgate mcp` to serve or relay again"
                        ),
                    };
                    vec![error_line(id, &message)]
                }
                None => Vec::new(),
            };
        };
        if let Some(s) = r.header("mcp-session-id") {
            self.session = Some(s.to_string());
        }
        let mut msgs = messages(&r);
        // Refused before MCP (a token needed, a host refused, not fieldgate at all): the
        // request still gets an answer, a JSON-RPC error saying why.
        let is_rpc = |m: &String| serde_json::from_str::<Value>(m).is_ok_and(|v| v.get("jsonrpc").is_some());
        if let Some(id) = id
            && !msgs.iter().any(is_rpc)
        {
            let why = r.json()["error"]["message"].as_str().map(str::to_string).unwrap_or_default();
            msgs = vec![error_line(
                id,
                &format!("the fieldgate service at {url} refused the request (HTTP {}): {why}", r.status),
            )];
        }
        // A notification has no answer to carry an error: what is not JSON-RPC (an HTTP
        // refusal's envelope) never reaches stdout, where it would break the client's framing.
        if id.is_none() && !msgs.iter().all(is_rpc) {
            let why = r.json()["error"]["message"].as_str().map(str::to_string).unwrap_or_default();
            tracing::warn!(%url, status = r.status, %why, "the service refused a notification");
            msgs.retain(is_rpc);
        }
        for m in &msgs {
            if let Some(v) = serde_json::from_str::<Value>(m).ok().and_then(|v| {
                v.pointer("/result/protocolVersion").and_then(Value::as_str).map(str::to_string)
            }) {
                self.version = Some(v);
            }
        }
        msgs
    }
}

async fn write_line(stdout: &mut tokio::io::Stdout, line: &str) -> std::io::Result<()> {
    stdout.write_all(format!("{line}\n").as_bytes()).await?;
    stdout.flush().await
}

/// A JSON-RPC error for input that has no usable id.
fn parse_error(message: &str) -> String {
    json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700, "message": message}}).to_string()
}

fn invalid_request(message: &str) -> String {
    json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32600, "message": message}}).to_string()
}

/// Answers every request on stdin with `message` (a JSON-RPC error) until stdin closes:
/// a client that cannot be served is told why instead of waiting.
pub async fn refuse_stdio(message: &str) -> Result<(), String> {
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut stdout = tokio::io::stdout();
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some(id) = request_id(&line) {
            if stdout.write_all(format!("{}\n", error_line(&id, message)).as_bytes()).await.is_err() {
                break;
            }
            let _ = stdout.flush().await;
        }
    }
    Err(message.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(content_type: &str, body: &str) -> HttpResponse {
        HttpResponse {
            status: 200,
            headers: vec![("content-type".into(), content_type.into())],
            body: body.as_bytes().to_vec(),
        }
    }

    #[test]
    fn answers_come_from_json_bodies_and_event_streams() {
        assert_eq!(messages(&response("application/json", "{\"id\":1}\n")), vec!["{\"id\":1}"]);
        let sse = "event: message\ndata: {\"id\":2}\n\nevent: message\ndata: {\"id\":3}\n\n";
        assert_eq!(messages(&response("text/event-stream", sse)), vec!["{\"id\":2}", "{\"id\":3}"]);
        assert!(messages(&response("application/json", "")).is_empty());
    }

    #[test]
    fn only_requests_get_an_error_back() {
        assert_eq!(request_id(r#"{"jsonrpc":"2.0","id":7,"method":"tools/list"}"#), Some(json!(7)));
        assert_eq!(request_id(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#), None);
        assert_eq!(request_id("not json"), None);
    }
}
