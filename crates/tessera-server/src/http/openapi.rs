//! The rules of the document that utoipa's derives cannot state: the rules between fields of a
//! body (`GpuShape`, `CreateToken`, `CreateWorkload`, as JSON Schema keywords from
//! `tessera_api`), and in each operation's description the refusals (422) no schema can state,
//! so that a client knows which schema-valid requests the server still refuses.

use serde_json::{Value, json};
use tessera_api::rules::DATE_RULES_NOT_IN_PATTERN;
use tessera_api::{CreateToken, CreateWorkload, GpuShape};

/// Adds the rules to the document's schemas and operations.
pub(super) fn state_rules(doc: &mut Value) {
    for (schema, rules) in [
        ("GpuShape", GpuShape::schema_rules()),
        ("CreateToken", CreateToken::schema_rules()),
        ("CreateWorkload", CreateWorkload::schema_rules()),
    ] {
        let s = doc["components"]["schemas"][schema]
            .as_object_mut()
            .unwrap_or_else(|| panic!("the document has the schema {schema}"));
        s.extend(rules.as_object().expect("keywords").clone());
    }
    let workload = format!(
        "no such tenant or project; an unknown priority class; {}; an image the tenant's image policy \
         cannot parse; an image missing where the backend runs containers",
        GpuShape::RULES_NOT_IN_SCHEMA
    );
    let dates = format!("`to` not after `from`; {DATE_RULES_NOT_IN_PATTERN}");
    let refusals: [(&str, &str, String); 10] = [
        (
            "post",
            "/api/v1/workloads",
            format!("{workload}; an `Idempotency-Key` already used with a different request body"),
        ),
        ("post", "/api/v1/workloads/dry-run", workload),
        ("post", "/api/v1/tokens", "an unknown tenant".into()),
        (
            "put",
            "/api/v1/tenants/{tenant}/quotas/{class}",
            "a class that is not a pool of the fleet (`POOL`), a model the pool has (`POOL/MODEL`) or a \
             project of the tenant (`project:NAME`); `limit` below `guaranteed`; more than three decimals"
                .into(),
        ),
        ("get", "/api/v1/usage", dates.clone()),
        ("get", "/api/v1/usage/intervals", dates),
        (
            "post",
            "/api/v1/nodes/{node}/drain",
            "`after=preempt` without a `deadline_s` (in the query or the body); a parameter given in both \
             the query and the body with different values"
                .into(),
        ),
        (
            "put",
            "/api/v1/tenants/{tenant}/image-policy",
            "a registry prefix that does not start with a registry host (with a `.` or `:`, or \
             `localhost`); a key that is not a PEM P-256 public key"
                .into(),
        ),
        (
            "post",
            "/api/v1/nodes/{node}/gpus/{gpu}/mig",
            "a GPU of a pool that is not a mig pool or of a model without MIG (`not-mig-capable`); a \
             backend that cannot switch MIG mode (`mig-mode-unsupported`)"
                .into(),
        ),
        (
            "post",
            "/api/v1/apply",
            "pools, models, projects and priority classes that do not exist; `limit` below `guaranteed`; \
             what each part's own operation refuses (image policies, quota classes of 1–200 characters)"
                .into(),
        ),
    ];
    for (method, path, why) in refusals {
        let op = doc["paths"][path][method]
            .as_object_mut()
            .unwrap_or_else(|| panic!("the document has {method} {path}"));
        let text = format!("Refused with 422 although the schema admits it: {why}.");
        let d = match op.get("description").and_then(Value::as_str) {
            Some(d) if !d.is_empty() => format!("{d}\n\n{text}"),
            _ => text,
        };
        op.insert("description".into(), json!(d));
    }
}
