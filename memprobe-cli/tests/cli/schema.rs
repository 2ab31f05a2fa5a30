//! A small JSON Schema checker: the subset of draft 2020-12 that memprobe's
//! schema files use (type, const, enum, properties, required,
//! dependentRequired, additionalProperties, items, prefixItems, minItems,
//! maxItems, anyOf, $ref into $defs, minimum). A keyword
//! outside that subset is an error, so the schema cannot silently use
//! something this checker ignores. Shared by the integration tests and the
//! crate's unit tests (included with `#[path]`).
//!
//! bindings/python/tests/schema_check.py is its Python twin, kept on
//! purpose: `cargo test` must not need Python, and the Python tests (of an
//! installed wheel) and scripts/gpu-validate-oom.py (on a GPU host) must not
//! need cargo. Both refuse keywords outside the same subset.

#![allow(dead_code)]

use serde_json::Value;

const ANNOTATIONS: [&str; 5] = ["$schema", "$id", "title", "description", "$defs"];

/// Checks `doc` against `schema`; returns every violation, with its path.
pub(crate) fn check(schema: &Value, doc: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    check_at(schema, schema, doc, "$", &mut errors);
    errors
}

/// Reads a schema file relative to the workspace root.
pub(crate) fn load(relative: &str) -> Value {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let text = std::fs::read_to_string(root.join(relative))
        .unwrap_or_else(|e| panic!("reading {relative}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{relative} is not JSON: {e}"))
}

/// Panics with every violation if `doc` does not match the schema file.
pub(crate) fn assert_valid(relative: &str, doc: &Value) {
    let errors = check(&load(relative), doc);
    assert!(
        errors.is_empty(),
        "document does not match {relative}:\n  {}",
        errors.join("\n  ")
    );
}

fn resolve<'a>(root: &'a Value, reference: &str) -> &'a Value {
    let name = reference
        .strip_prefix("#/$defs/")
        .unwrap_or_else(|| panic!("unsupported $ref {reference}"));
    root.get("$defs")
        .and_then(|d| d.get(name))
        .unwrap_or_else(|| panic!("$ref {reference} names nothing"))
}

fn type_matches(t: &str, v: &Value) -> bool {
    match t {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "string" => v.is_string(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        "number" => v.is_number(),
        "integer" => v.is_u64() || v.is_i64(),
        other => panic!("unknown type {other}"),
    }
}

fn check_at(root: &Value, schema: &Value, v: &Value, path: &str, errors: &mut Vec<String>) {
    let obj = match schema {
        Value::Bool(true) => return,
        Value::Bool(false) => {
            errors.push(format!("{path}: not allowed"));
            return;
        }
        Value::Object(o) => o,
        other => panic!("schema at {path} is not an object: {other}"),
    };
    for (key, s) in obj {
        match key.as_str() {
            k if ANNOTATIONS.contains(&k) => {}
            "$ref" => check_at(root, resolve(root, s.as_str().unwrap()), v, path, errors),
            "type" => {
                let ok = match s {
                    Value::String(t) => type_matches(t, v),
                    Value::Array(ts) => ts.iter().any(|t| type_matches(t.as_str().unwrap(), v)),
                    _ => panic!("bad type at {path}"),
                };
                if !ok {
                    errors.push(format!("{path}: {v} is not of type {s}"));
                }
            }
            "const" => {
                if v != s {
                    errors.push(format!("{path}: {v} is not {s}"));
                }
            }
            "enum" => {
                if !s.as_array().unwrap().contains(v) {
                    errors.push(format!("{path}: {v} is not one of {s}"));
                }
            }
            "minimum" => {
                if let (Some(x), Some(min)) = (v.as_f64(), s.as_f64()) {
                    if x < min {
                        errors.push(format!("{path}: {v} is below {s}"));
                    }
                }
            }
            "required" => {
                if let Some(o) = v.as_object() {
                    for r in s.as_array().unwrap() {
                        let r = r.as_str().unwrap();
                        if !o.contains_key(r) {
                            errors.push(format!("{path}: missing required field {r}"));
                        }
                    }
                }
            }
            "dependentRequired" => {
                if let Some(o) = v.as_object() {
                    for (name, needs) in s.as_object().unwrap() {
                        if !o.contains_key(name) {
                            continue;
                        }
                        for r in needs.as_array().unwrap() {
                            let r = r.as_str().unwrap();
                            if !o.contains_key(r) {
                                errors.push(format!("{path}: {name} without {r}"));
                            }
                        }
                    }
                }
            }
            "properties" => {
                if let Some(o) = v.as_object() {
                    for (name, sub) in s.as_object().unwrap() {
                        if let Some(x) = o.get(name) {
                            check_at(root, sub, x, &format!("{path}.{name}"), errors);
                        }
                    }
                }
            }
            "additionalProperties" => {
                if let Some(o) = v.as_object() {
                    let known = obj.get("properties").and_then(Value::as_object);
                    for (name, x) in o {
                        if known.is_some_and(|k| k.contains_key(name)) {
                            continue;
                        }
                        match s {
                            Value::Bool(false) => {
                                errors.push(format!("{path}: unexpected field {name}"));
                            }
                            sub => check_at(root, sub, x, &format!("{path}.{name}"), errors),
                        }
                    }
                }
            }
            "items" => {
                if let Some(a) = v.as_array() {
                    for (i, x) in a.iter().enumerate() {
                        check_at(root, s, x, &format!("{path}[{i}]"), errors);
                    }
                }
            }
            "prefixItems" => {
                if let Some(a) = v.as_array() {
                    for (i, (x, sub)) in a.iter().zip(s.as_array().unwrap()).enumerate() {
                        check_at(root, sub, x, &format!("{path}[{i}]"), errors);
                    }
                }
            }
            "minItems" | "maxItems" => {
                if let (Some(a), Some(n)) = (v.as_array(), s.as_u64()) {
                    let len = a.len() as u64;
                    if (key == "minItems" && len < n) || (key == "maxItems" && len > n) {
                        errors.push(format!("{path}: {len} items, {key} {n}"));
                    }
                }
            }
            "anyOf" => {
                let branches = s.as_array().unwrap();
                let any = branches.iter().any(|b| {
                    let mut e = Vec::new();
                    check_at(root, b, v, path, &mut e);
                    e.is_empty()
                });
                if !any {
                    let mut why = Vec::new();
                    for b in branches {
                        check_at(root, b, v, path, &mut why);
                    }
                    errors.push(format!(
                        "{path}: matches no branch of anyOf: {}",
                        why.join("; ")
                    ));
                }
            }
            other => panic!("schema keyword {other} at {path} is not supported by this checker"),
        }
    }
}

#[test]
fn the_checker_catches_disagreements() {
    let schema = serde_json::json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["a", "b"],
        "dependentRequired": { "e": ["f"] },
        "properties": {
            "a": { "type": "integer", "minimum": 0 },
            "b": { "anyOf": [{ "$ref": "#/$defs/x" }, { "type": "null" }] },
            "c": { "type": "array", "items": { "enum": ["p", "q"] } },
            "d": { "type": "array", "prefixItems": [{ "type": "number" }, { "type": "integer" }], "minItems": 2, "maxItems": 2 },
            "e": { "type": "integer" },
            "f": { "type": "integer" }
        },
        "$defs": { "x": { "type": "object", "required": ["k"], "properties": { "k": { "const": 1 } } } }
    });
    let good = serde_json::json!({ "a": 1, "b": { "k": 1 }, "c": ["p"], "d": [0.5, 3] });
    assert!(
        check(&schema, &good).is_empty(),
        "{:?}",
        check(&schema, &good)
    );
    assert!(check(&schema, &serde_json::json!({ "a": 1, "b": null })).is_empty());
    assert!(check(
        &schema,
        &serde_json::json!({ "a": 1, "b": null, "e": 1, "f": 2 })
    )
    .is_empty());
    assert!(check(&schema, &serde_json::json!({ "a": 1, "b": null, "f": 2 })).is_empty());
    for bad in [
        serde_json::json!({ "a": 1 }),
        serde_json::json!({ "a": -1, "b": null }),
        serde_json::json!({ "a": 1.5, "b": null }),
        serde_json::json!({ "a": 1, "b": null, "extra": 0 }),
        serde_json::json!({ "a": 1, "b": { "k": 2 } }),
        serde_json::json!({ "a": 1, "b": null, "c": ["z"] }),
        serde_json::json!({ "a": 1, "b": null, "d": [0.5, 1.5] }),
        serde_json::json!({ "a": 1, "b": null, "d": [0.5] }),
        serde_json::json!({ "a": 1, "b": null, "d": [0.5, 1, 2] }),
        serde_json::json!({ "a": 1, "b": null, "e": 1 }),
    ] {
        assert!(!check(&schema, &bad).is_empty(), "accepted {bad}");
    }
}
