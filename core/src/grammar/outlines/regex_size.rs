//! An upper bound on the length of the regex that outlines-core writes for a JSON schema,
//! computed before it writes it.
//!
//! outlines-core builds the regex as one string, and some shapes repeat a sub-schema's regex:
//! an array's `items` and an object's `additionalProperties` appear twice, a property of an
//! object with no required property appears once per later property, and an unconstrained
//! `object`/`array` expands to every type down to its `depth`. A 3 KB schema of 126 nested
//! arrays therefore asks for a 2^126-byte string, and the process is killed for its memory.
//! This walk follows outlines-core's dispatch (the first matching key wins, the same order) and
//! adds up what each node writes, saturating at the limit, so such a schema is refused in
//! microseconds. It over-estimates a little (a fixed allowance per node), never under.

use serde_json::{Map, Value};

/// The longest regex outlines may build for one schema. Real-world tool and response schemas
/// stay far below (a 30-property object with nested arrays is ~20 KB).
pub(crate) const MAX_SCHEMA_REGEX_BYTES: u64 = 4 << 20;

/// outlines-core's default `$ref` recursion depth (`regex_from_str(.., None)`).
const REF_DEPTH: usize = 3;

/// Deeper walks than this are refused whatever their size (a `depth` of 10^9 or a long
/// `$ref` chain would otherwise recurse that far).
const MAX_WALK_DEPTH: usize = 256;

/// What a node writes besides its children: delimiters, the whitespace pattern, a number
/// or string pattern. The longest of outlines-core's fixed patterns (a date-time format) is
/// under 300 bytes.
const NODE: u64 = 320;

/// Why a schema is refused before its regex is built.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum TooLarge {
    /// The regex would be longer than [`MAX_SCHEMA_REGEX_BYTES`].
    Regex,
    /// The walk went deeper than [`MAX_WALK_DEPTH`].
    Depth,
}

/// Checks that outlines-core's regex for `schema` stays under [`MAX_SCHEMA_REGEX_BYTES`].
pub(crate) fn check(schema: &Value) -> Result<(), TooLarge> {
    let mut walk = Walk {
        root: schema,
        refs: 0,
        depth: 0,
    };
    let size = walk.node(schema)?;
    if size > MAX_SCHEMA_REGEX_BYTES {
        return Err(TooLarge::Regex);
    }
    Ok(())
}

struct Walk<'a> {
    root: &'a Value,
    refs: usize,
    depth: usize,
}

/// `a + b`, or `Regex` once past the limit (so no walk continues past it).
fn add(a: u64, b: u64) -> Result<u64, TooLarge> {
    let sum = a.saturating_add(b);
    if sum > MAX_SCHEMA_REGEX_BYTES {
        return Err(TooLarge::Regex);
    }
    Ok(sum)
}

fn times(n: u64, size: u64) -> Result<u64, TooLarge> {
    add(0, n.saturating_mul(size))
}

impl<'a> Walk<'a> {
    fn node(&mut self, value: &'a Value) -> Result<u64, TooLarge> {
        self.depth += 1;
        if self.depth > MAX_WALK_DEPTH {
            return Err(TooLarge::Depth);
        }
        let size = self.dispatch(value);
        self.depth -= 1;
        size
    }

    fn dispatch(&mut self, value: &'a Value) -> Result<u64, TooLarge> {
        let Value::Object(obj) = value else {
            return Ok(NODE);
        };
        if obj.is_empty() {
            // Every type, objects and arrays at their default depth.
            let mut size = NODE;
            for ty in ["boolean", "null", "number", "integer", "string"] {
                size = add(size, self.simple(ty, obj))?;
            }
            size = add(size, self.object(None, 2)?)?;
            return add(size, self.array(None, 2)?);
        }
        if let Some(props) = obj.get("properties").and_then(Value::as_object) {
            return self.properties(obj, props);
        }
        for key in ["allOf", "anyOf", "oneOf", "prefixItems"] {
            if obj.contains_key(key) {
                return self.all(obj.get(key));
            }
        }
        if let Some(values) = obj.get("enum") {
            return add(NODE, constant(values));
        }
        if let Some(value) = obj.get("const") {
            return add(NODE, constant(value));
        }
        if let Some(reference) = obj.get("$ref") {
            return self.reference(reference);
        }
        match obj.get("type") {
            Some(Value::String(ty)) => self.typed(ty, obj),
            Some(Value::Array(types)) => {
                let mut size = NODE;
                for ty in types.iter().filter_map(Value::as_str) {
                    size = add(size, self.typed(ty, obj)?)?;
                }
                Ok(size)
            }
            _ => Ok(NODE),
        }
    }

    fn all(&mut self, list: Option<&'a Value>) -> Result<u64, TooLarge> {
        let mut size = NODE;
        if let Some(Value::Array(items)) = list {
            for item in items {
                size = add(size, self.node(item)?)?;
            }
        }
        Ok(size)
    }

    fn properties(
        &mut self,
        obj: &'a Map<String, Value>,
        props: &'a Map<String, Value>,
    ) -> Result<u64, TooLarge> {
        let any_required = obj
            .get("required")
            .and_then(Value::as_array)
            .is_some_and(|r| {
                r.iter()
                    .filter_map(Value::as_str)
                    .any(|n| props.contains_key(n))
            });
        let n = props.len() as u64;
        let mut size = NODE;
        for (i, (name, value)) in props.iter().enumerate() {
            let one = add(NODE + 2 * name.len() as u64, self.node(value)?)?;
            // With no required property, property i is repeated in every later alternative.
            let copies = if any_required { 1 } else { n - i as u64 };
            size = add(size, times(copies, one)?)?;
        }
        Ok(size)
    }

    fn reference(&mut self, reference: &'a Value) -> Result<u64, TooLarge> {
        if self.refs > REF_DEPTH {
            // outlines-core stops here (an error, or the property is left out).
            return Ok(NODE);
        }
        let Some(path) = reference.as_str() else {
            return Ok(NODE);
        };
        let fragment = path.rsplit_once('#').map_or(path, |(_, f)| f);
        let mut target = self.root;
        for part in fragment.split('/').filter(|p| !p.is_empty()) {
            match target.get(part) {
                Some(next) => target = next,
                None => return Ok(NODE),
            }
        }
        self.refs += 1;
        let size = self.node(target);
        self.refs -= 1;
        size
    }

    fn typed(&mut self, ty: &str, obj: &'a Map<String, Value>) -> Result<u64, TooLarge> {
        let depth = obj.get("depth").and_then(Value::as_u64).unwrap_or(2);
        match ty {
            "object" => self.object(Some(obj), depth),
            "array" => self.array(Some(obj), depth),
            other => Ok(self.simple(other, obj)),
        }
    }

    fn simple(&self, ty: &str, obj: &Map<String, Value>) -> u64 {
        let pattern = match ty {
            "string" => obj
                .get("pattern")
                .and_then(Value::as_str)
                .map_or(0, str::len),
            _ => 0,
        };
        NODE + pattern as u64
    }

    /// An `object` type: its value pattern twice (first key and every later key).
    fn object(&mut self, obj: Option<&'a Map<String, Value>>, depth: u64) -> Result<u64, TooLarge> {
        let field = |key: &str| obj.and_then(|o| o.get(key));
        if field("maxProperties").and_then(Value::as_u64) == Some(0) {
            return Ok(NODE);
        }
        let value = match field("additionalProperties") {
            None | Some(Value::Bool(true)) => self.any_value(depth, false)?,
            Some(schema) => self.node(schema)?,
        };
        add(NODE, times(2, value)?)
    }

    /// An `array` type: its item pattern twice (first item and every later item).
    fn array(&mut self, obj: Option<&'a Map<String, Value>>, depth: u64) -> Result<u64, TooLarge> {
        let field = |key: &str| obj.and_then(|o| o.get(key));
        if field("maxItems").and_then(Value::as_u64) == Some(0) {
            return Ok(NODE);
        }
        let items = match field("items") {
            Some(schema) => self.node(schema)?,
            None => self.any_value(depth, true)?,
        };
        add(NODE, times(2, items)?)
    }

    /// The unconstrained value inside an object or array: the simple types, and objects and
    /// arrays one level shallower while `depth` lasts.
    fn any_value(&mut self, depth: u64, integer: bool) -> Result<u64, TooLarge> {
        let simple = if integer { 5 } else { 4 };
        let mut size = times(simple + 1, NODE)?;
        if depth > 0 {
            self.depth += 1;
            if self.depth > MAX_WALK_DEPTH {
                return Err(TooLarge::Depth);
            }
            let inner = add(self.object(None, depth - 1)?, self.array(None, depth - 1)?);
            self.depth -= 1;
            size = add(size, inner?)?;
        }
        Ok(size)
    }
}

/// What `enum` and `const` write: the values' JSON, escaped (at most twice as long).
fn constant(value: &Value) -> u64 {
    let text = serde_json::to_string(value).map_or(0, |t| t.len() as u64);
    NODE + 2 * text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The estimate never falls below what outlines-core writes, on the shapes it repeats.
    #[test]
    fn estimate_bounds_outlines_regex_length() {
        let schemas = [
            json!({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}, "required": ["a"]}),
            json!({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "array", "items": {"type": "number"}}, "c": {"type": "boolean"}}}),
            json!({"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "string", "format": "date-time"}}}}),
            json!({}),
            json!({"type": "object"}),
            json!({"type": "array", "depth": 4}),
            json!({"type": "object", "properties": {"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}}}),
            json!({"enum": ["a", 1, {"k": [1, 2]}], "type": "string"}),
            json!({"type": ["string", "object", "array"]}),
        ];
        for schema in schemas {
            let regex = outlines_core::json_schema::regex_from_value(&schema, None, None)
                .expect("outlines writes a regex");
            let mut walk = Walk {
                root: &schema,
                refs: 0,
                depth: 0,
            };
            let estimate = walk.node(&schema).expect("small schema");
            assert!(
                estimate >= regex.len() as u64,
                "{schema}: {estimate} < {}",
                regex.len()
            );
            assert!(
                estimate < 64 * regex.len() as u64 + 4096,
                "{schema}: {estimate} is far off"
            );
        }
    }

    #[test]
    fn exponential_shapes_are_refused_without_being_built() {
        let nested_arrays: Value = serde_json::from_str(&format!(
            "{}{{}}{}",
            "{\"type\":\"array\",\"items\":".repeat(126),
            "}".repeat(126)
        ))
        .expect("json");
        assert_eq!(check(&nested_arrays), Err(TooLarge::Regex));
        // Refused for its size or for its depth, whichever the walk meets first.
        assert!(check(&json!({"type": "object", "depth": 1_000_000_000u64})).is_err());
        // A tree of $refs: each definition names the next one twice.
        let mut defs = Map::new();
        for i in 0..60 {
            defs.insert(
                format!("d{i}"),
                json!({"type": "object", "properties": {"l": {"$ref": format!("#/$defs/d{}", i + 1)}, "r": {"$ref": format!("#/$defs/d{}", i + 1)}}, "required": ["l", "r"]}),
            );
        }
        defs.insert("d60".into(), json!({"type": "string"}));
        let tree = json!({"$ref": "#/$defs/d0", "$defs": defs});
        // outlines-core's $ref depth of 3 bounds this one; it must pass, and quickly.
        assert_eq!(check(&tree), Ok(()));
        // Ten levels of arrays are fine (about 2^10 times a string pattern).
        let ten: Value = serde_json::from_str(&format!(
            "{}{{\"type\":\"string\"}}{}",
            "{\"type\":\"array\",\"items\":".repeat(10),
            "}".repeat(10)
        ))
        .expect("json");
        assert_eq!(check(&ten), Ok(()));
    }
}
