//! The protocol bindings (spec §5: JSON-RPC §9, gRPC §10, HTTP+JSON
//! §11): their names on the cards, on the command line and in metrics,
//! and which of them a server serves. The bindings themselves are
//! `service::grpc`, `service::jsonrpc` and `service::http_json`.

/// The protocol bindings this server speaks (spec §5, §9, §10, §11).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Binding {
    #[default]
    Grpc,
    JsonRpc,
    HttpJson,
}

impl Binding {
    pub const ALL: [Binding; 3] = [Binding::Grpc, Binding::JsonRpc, Binding::HttpJson];

    /// The `protocolBinding` of an `AgentInterface` (spec §4.4.6).
    pub fn protocol_binding(self) -> &'static str {
        match self {
            Binding::Grpc => "GRPC",
            Binding::JsonRpc => "JSONRPC",
            Binding::HttpJson => "HTTP+JSON",
        }
    }

    /// The name `serve --bindings` takes and metrics label calls with.
    pub fn name(self) -> &'static str {
        match self {
            Binding::Grpc => "grpc",
            Binding::JsonRpc => "jsonrpc",
            Binding::HttpJson => "http-json",
        }
    }

    /// The binding `serve --bindings` names (also the card's spelling).
    pub fn parse(name: &str) -> Option<Binding> {
        Binding::ALL.into_iter().find(|b| {
            b.name().eq_ignore_ascii_case(name) || b.protocol_binding().eq_ignore_ascii_case(name)
        })
    }
}

/// Which bindings a server serves (`serve --bindings`); all by default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BindingSet([bool; 3]);

impl Default for BindingSet {
    fn default() -> Self {
        BindingSet([true; 3])
    }
}

impl BindingSet {
    pub const NONE: BindingSet = BindingSet([false; 3]);

    fn index(binding: Binding) -> usize {
        match binding {
            Binding::Grpc => 0,
            Binding::JsonRpc => 1,
            Binding::HttpJson => 2,
        }
    }

    pub fn with(mut self, binding: Binding) -> Self {
        self.0[Self::index(binding)] = true;
        self
    }

    pub fn contains(&self, binding: Binding) -> bool {
        self.0[Self::index(binding)]
    }

    /// The bindings served, in the order the cards list them (gRPC,
    /// JSON-RPC, HTTP+JSON: the first is the preferred one, spec
    /// §8.3.1).
    pub fn iter(&self) -> impl Iterator<Item = Binding> + '_ {
        Binding::ALL.into_iter().filter(|b| self.contains(*b))
    }

    /// A comma-separated list of binding names (`grpc,jsonrpc`).
    pub fn parse(list: &str) -> Result<BindingSet, String> {
        let mut set = BindingSet::NONE;
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let binding = Binding::parse(name).ok_or_else(|| {
                format!("unknown binding {name:?}: the bindings are grpc, jsonrpc, http-json")
            })?;
            set = set.with(binding);
        }
        if set == BindingSet::NONE {
            return Err("at least one binding must be served".into());
        }
        Ok(set)
    }
}

impl std::fmt::Display for Binding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
