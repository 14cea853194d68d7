//! Who calls, and what they may do: a [`Caller`] carries its [`Scopes`]. Static tokens
//! name a [`Role`] (a fixed set of scopes); OAuth access tokens carry the scopes the
//! identity provider granted. Every check asks for one [`Scope`].

use super::Tool;

/// One thing a caller may do. The names are the OAuth scopes of `docs/security.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::EnumIter)]
pub enum Scope {
    /// The read tools, the sensor, device and work-order routes, `/metrics`.
    #[strum(serialize = "fieldgate.read")]
    Read,
    /// `create_work_order`.
    #[strum(serialize = "fieldgate.work_orders.write")]
    WriteWorkOrders,
    /// Deciding work orders, probing devices, the console's operator actions.
    #[strum(serialize = "fieldgate.operator")]
    Operate,
}

impl Scope {
    /// The scope's name in tokens and challenges.
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// The scope named `name`, if fieldgate knows it.
    pub fn named(name: &str) -> Option<Scope> {
        use strum::IntoEnumIterator;
        Scope::iter().find(|s| s.name() == name)
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// A set of scopes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Scopes(u8);

impl Scopes {
    pub const NONE: Scopes = Scopes(0);

    pub fn of(list: &[Scope]) -> Scopes {
        Scopes(list.iter().fold(0, |acc, s| acc | s.bit()))
    }

    /// The scopes fieldgate knows in a space-separated `scope` claim; others are ignored.
    pub fn parse(text: &str) -> Scopes {
        // Separated by spaces only (RFC 6749 §3.3): a tab is part of a (then unknown) name.
        Scopes::of(&text.split(' ').filter_map(Scope::named).collect::<Vec<_>>())
    }

    pub fn union(self, other: Scopes) -> Scopes {
        Scopes(self.0 | other.0)
    }

    pub fn has(self, scope: Scope) -> bool {
        self.0 & scope.bit() != 0
    }

    /// The names of the scopes in the set, in a fixed order.
    pub fn names(self) -> Vec<&'static str> {
        use strum::IntoEnumIterator;
        Scope::iter().filter(|s| self.has(*s)).map(Scope::name).collect()
    }
}

/// What a static token may do: a fixed set of scopes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads, and creates work orders.
    Agent,
    /// Everything: also decides work orders, probes devices and uses the console.
    Operator,
}

impl Role {
    pub fn scopes(self) -> Scopes {
        match self {
            Role::Agent => Scopes::of(&[Scope::Read, Scope::WriteWorkOrders]),
            Role::Operator => Scopes::of(&[Scope::Read, Scope::WriteWorkOrders, Scope::Operate]),
        }
    }
}

/// Who is calling: the name of their token, their identity at the identity provider
/// (`sub@issuer`), or "local"/"anonymous"; and what they may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub id: String,
    pub scopes: Scopes,
    /// When the credential expires (an access token's `exp`, Unix seconds): what is opened
    /// with it (a console session) ends then too. `None`: a static token.
    pub expires: Option<i64>,
}

impl Caller {
    /// A caller with the scopes of `role` (static tokens).
    pub fn with_role(id: impl Into<String>, role: Role) -> Caller {
        Caller { id: id.into(), scopes: role.scopes(), expires: None }
    }

    /// The command line and MCP over stdio: a local process of the operator's.
    pub fn local() -> Caller {
        Caller::with_role("local", Role::Operator)
    }

    /// A caller on a loopback listener without tokens.
    pub fn anonymous() -> Caller {
        Caller::with_role("anonymous", Role::Agent)
    }

    pub fn may(&self, scope: Scope) -> bool {
        self.scopes.has(scope)
    }

    pub fn is_operator(&self) -> bool {
        self.may(Scope::Operate)
    }
}

impl Tool {
    /// The scope a call of this tool needs.
    pub fn scope(self) -> Scope {
        match self {
            Tool::CreateWorkOrder => Scope::WriteWorkOrders,
            _ => Scope::Read,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_parse_from_a_claim_and_ignore_others() {
        let s = Scopes::parse("openid fieldgate.read  fieldgate.operator fieldgate.readx");
        assert!(s.has(Scope::Read) && s.has(Scope::Operate) && !s.has(Scope::WriteWorkOrders));
        assert_eq!(s.names(), ["fieldgate.read", "fieldgate.operator"]);
        assert_eq!(Scopes::parse(""), Scopes::NONE);
        // Spaces separate scopes, nothing else does (RFC 6749 §3.3).
        assert_eq!(Scopes::parse("fieldgate.read\tfieldgate.operator"), Scopes::NONE);
        assert_eq!(
            Scopes::parse("fieldgate.read\nfieldgate.operator fieldgate.read").names(),
            ["fieldgate.read"]
        );
    }

    #[test]
    fn roles_are_their_scopes() {
        let agent = Caller::with_role("a", Role::Agent);
        assert!(agent.may(Scope::Read) && agent.may(Scope::WriteWorkOrders) && !agent.is_operator());
        assert!(Caller::local().is_operator());
        assert_eq!(Tool::CreateWorkOrder.scope(), Scope::WriteWorkOrders);
        assert_eq!(Tool::ListWorkOrders.scope(), Scope::Read);
    }
}
