//! Who is looking at a page: nobody signed in (no tokens configured) or a session.

use std::time::Instant;

use crate::tools::Caller;

/// A signed-in person.
#[derive(Debug, Clone)]
pub struct Session {
    pub caller: Caller,
    pub csrf: String,
    pub(super) expires: Instant,
}

/// Who is looking.
#[derive(Debug, Clone)]
pub enum Viewer {
    /// No tokens configured: anyone may look, nobody may act.
    Open,
    /// Signed in with a token.
    Signed(Session),
}

impl Viewer {
    /// The CSRF token forms carry, when there is a session.
    pub fn csrf(&self) -> Option<&str> {
        match self {
            Viewer::Open => None,
            Viewer::Signed(s) => Some(&s.csrf),
        }
    }

    pub fn is_operator(&self) -> bool {
        matches!(self, Viewer::Signed(s) if s.caller.is_operator())
    }
}
