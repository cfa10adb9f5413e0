//! The options table lives in `nanowire-options` (shared with the preload
//! shim, which must not depend on the launcher); the launcher adds its JSON
//! form.

pub use nanowire_options::*;

/// The table as JSON (`nanowire run --list-options --json`).
pub fn table_json() -> serde_json::Value {
    serde_json::Value::Array(
        OPTIONS
            .iter()
            .map(|o| {
                serde_json::json!({
                    "name": o.name, "env": o.env, "type": o.ty.as_str(), "default": o.default,
                    "range": o.range, "doc": o.doc,
                    "profiles": { "latency": o.profiles[0], "balanced": o.profiles[1], "throughput": o.profiles[2] },
                })
            })
            .collect(),
    )
}
