//! The answer to a request head hyper cannot parse. hyper answers such a head itself,
//! before any handler runs (400 for bytes that are not HTTP/1.1, 431 for a head over its
//! buffer, 414 for a URI over its limit), with an empty body. Every answer of the HTTP API
//! is a JSON envelope, so the served socket is wrapped in [`EnvelopeIo`], which recognises
//! those automatic answers as hyper writes them and sends the envelope in their place.
//!
//! Recognised: one write holding a whole head (ending in an empty line) with one of those
//! statuses and `content-length: 0`. Our own handlers never answer those statuses with an
//! empty body, and a body chunk never ends in a complete status line and head, so nothing
//! else is rewritten. A test through a real socket holds this to hyper's behaviour.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::tools::{Envelope, ErrorCode, Meta, ToolError};

/// A served socket whose hyper-made refusals are replaced by JSON envelopes.
pub struct EnvelopeIo<T> {
    inner: T,
    /// Bytes of a replacement answer not yet written.
    pending: Vec<u8>,
    sent: usize,
}

impl<T> EnvelopeIo<T> {
    pub fn new(inner: T) -> EnvelopeIo<T> {
        EnvelopeIo { inner, pending: Vec::new(), sent: 0 }
    }
}

impl<T: AsyncWrite + Unpin> EnvelopeIo<T> {
    /// Writes what is left of a replacement answer.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.pending.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.pending.clear();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }

    /// Takes `head` (hyper's whole write) in place of writing it, when it is one of
    /// hyper's automatic refusals; the envelope goes out instead.
    fn replace(&mut self, cx: &mut Context<'_>, head: &[u8]) -> Option<io::Result<usize>> {
        let answer = replacement_for(head)?;
        self.pending = answer;
        self.sent = 0;
        // What does not go out now goes out on the flush hyper makes next.
        match self.drain(cx) {
            Poll::Ready(Err(e)) => Some(Err(e)),
            _ => Some(Ok(head.len())),
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for EnvelopeIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for EnvelopeIo<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        ready!(self.drain(cx))?;
        if let Some(done) = self.replace(cx, buf) {
            return Poll::Ready(done);
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        ready!(self.drain(cx))?;
        let mut filled = bufs.iter().filter(|b| !b.is_empty());
        if let (Some(only), None) = (filled.next(), filled.next())
            && let Some(done) = self.replace(cx, only)
        {
            return Poll::Ready(done);
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.drain(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.drain(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The envelope answer (status line, headers, body) for one of hyper's automatic
/// refusals, or `None` when `head` is anything else.
fn replacement_for(head: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(head).ok()?;
    if !text.ends_with("\r\n\r\n") {
        return None;
    }
    let status = text.strip_prefix("HTTP/1.1 ")?.get(..3)?;
    if !text.to_ascii_lowercase().contains("\r\ncontent-length: 0\r\n") {
        return None;
    }
    let error = match status {
        "400" => ToolError::new(
            ErrorCode::MalformedRequest,
            "The request is not valid HTTP/1.1.",
            "Send a request line, headers and an empty line; see GET /openapi.json.",
        ),
        "414" | "431" => ToolError::new(
            ErrorCode::RequestHeadTooLarge,
            "The request line or headers are too large.",
            "Send a shorter URI and fewer or smaller headers.",
        ),
        _ => return None,
    };
    let envelope = Envelope::failure(error, Meta::refusal("http"));
    let status = super::status::status_of(&envelope);
    let body = envelope.to_json();
    let mut answer = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    )
    .into_bytes();
    answer.extend_from_slice(&body);
    Some(answer)
}

#[cfg(test)]
mod tests {
    use super::replacement_for;

    #[test]
    fn only_hypers_empty_refusals_are_replaced() {
        let refused = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        let answer = String::from_utf8(replacement_for(refused).expect("replaced")).expect("text");
        assert!(answer.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{answer}");
        assert!(answer.contains("\"code\":\"MALFORMED_REQUEST\""), "{answer}");
        let too_large = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n\r\n";
        let answer = String::from_utf8(replacement_for(too_large).expect("replaced")).expect("text");
        assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
        assert!(answer.contains("\"code\":\"REQUEST_HEAD_TOO_LARGE\""), "{answer}");
        // Our own answers carry a body; other statuses and partial heads pass untouched.
        assert!(replacement_for(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 80\r\n\r\n").is_none());
        assert!(replacement_for(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n").is_none());
        assert!(replacement_for(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n").is_none());
        assert!(replacement_for(b"{\"ok\":true}").is_none());
    }
}
