//! The `WWW-Authenticate` challenges of the bearer check (RFC 6750, and MCP's
//! authorization specification): a 401 names the resource metadata (RFC 9728) and the
//! scopes the request needs, with `error="invalid_token"` when a token was presented and
//! refused; a 403 says `error="insufficient_scope"` and which scope is missing.

use axum::http::HeaderValue;

use super::auth::Tokens;
use crate::tools::{Scope, Scopes};

/// Challenges of one server.
#[derive(Debug, Clone, Default)]
pub struct Challenge {
    /// Where the resource metadata is, when `[server.oauth]` is set.
    metadata_url: Option<String>,
}

/// A quoted-string value: the few characters that could break out are dropped.
fn quoted(s: &str) -> String {
    s.chars().filter(|c| *c != '"' && *c != '\\' && !c.is_control()).collect()
}

impl Challenge {
    pub fn of(tokens: &Tokens) -> Challenge {
        Challenge { metadata_url: tokens.oauth().map(|o| o.metadata_url()) }
    }

    fn header(&self, parts: &[(&str, &str)]) -> HeaderValue {
        let mut fields: Vec<String> = Vec::new();
        if let Some(url) = &self.metadata_url {
            fields.push(format!("resource_metadata=\"{}\"", quoted(url)));
        }
        fields.extend(parts.iter().map(|(k, v)| format!("{k}=\"{}\"", quoted(v))));
        let text =
            if fields.is_empty() { "Bearer".to_string() } else { format!("Bearer {}", fields.join(", ")) };
        HeaderValue::from_str(&text).unwrap_or(HeaderValue::from_static("Bearer"))
    }

    /// 401: no token (`refused: None`), or one refused for `refused`.
    pub fn unauthorized(&self, scopes: &[Scope], refused: Option<&str>) -> HeaderValue {
        let scope = names(scopes);
        match refused {
            None => self.header(&[("scope", &scope)]),
            Some(why) => {
                self.header(&[("error", "invalid_token"), ("error_description", why), ("scope", &scope)])
            }
        }
    }

    /// 403: the token, granted `held`, lacks `needed`. The scope asked for is both: a
    /// client that asks its provider for exactly the challenge's scopes (MCP 2025-11-25's
    /// step-up, as the Python SDK does) keeps what it could do before.
    pub fn insufficient(&self, needed: Scope, held: Scopes) -> HeaderValue {
        let all = Scopes::of(&[needed]).union(held).names().join(" ");
        self.header(&[("error", "insufficient_scope"), ("scope", &all)])
    }
}

fn names(scopes: &[Scope]) -> String {
    scopes.iter().map(|s| s.name()).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_name_the_metadata_the_error_and_the_scope() {
        let c = Challenge {
            metadata_url: Some("https://e:8443/.well-known/oauth-protected-resource/mcp".into()),
        };
        assert_eq!(
            c.unauthorized(&[Scope::Read], None),
            "Bearer resource_metadata=\"https://e:8443/.well-known/oauth-protected-resource/mcp\", scope=\"fieldgate.read\""
        );
        assert_eq!(
            c.unauthorized(&[Scope::Read], Some("the token \"has\" expired")),
            "Bearer resource_metadata=\"https://e:8443/.well-known/oauth-protected-resource/mcp\", error=\"invalid_token\", error_description=\"the token has expired\", scope=\"fieldgate.read\""
        );
        assert_eq!(
            Challenge::default().insufficient(Scope::WriteWorkOrders, Scopes::of(&[Scope::Read])),
            "Bearer error=\"insufficient_scope\", scope=\"fieldgate.read fieldgate.work_orders.write\""
        );
        assert_eq!(
            Challenge::default().insufficient(Scope::Operate, Scopes::NONE),
            "Bearer error=\"insufficient_scope\", scope=\"fieldgate.operator\""
        );
    }
}
