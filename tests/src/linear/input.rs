//! Reading GraphQL input objects (filters, mutation inputs, arguments) so that nothing is
//! silently ignored: every key read is remembered, and any other key with a value is refused
//! with an error naming it. The schema already refused keys Linear does not have; this refuses
//! the ones Linear has but the stand-in does not implement.

use apollo_compiler::response::{JsonMap, JsonValue};

/// The error for a key Linear has and the stand-in does not implement.
pub(crate) fn unimplemented(path: &str) -> String {
    format!("`{path}` is not implemented by the Linear stand-in: it refuses it rather than ignore it")
}

/// An input object being read. Null values count as absent, as Linear treats them.
pub(crate) struct Input<'v> {
    map: Option<&'v JsonMap>,
    path: String,
    read: Vec<&'static str>,
}

impl<'v> Input<'v> {
    /// The object at `path` (absent or null: an empty one).
    pub(crate) fn new(value: Option<&'v JsonValue>, path: &str) -> Result<Self, String> {
        let map = match value {
            None | Some(JsonValue::Null) => None,
            Some(JsonValue::Object(map)) => Some(map),
            Some(other) => return Err(format!("`{path}` must be an input object, got {other}")),
        };
        Ok(Self { map, path: path.into(), read: Vec::new() })
    }

    /// The arguments of a field, read like an input object.
    pub(crate) fn args(args: &'v JsonMap, field: &str) -> Self {
        Self { map: Some(args), path: field.into(), read: Vec::new() }
    }

    /// Where this object is, for error messages.
    pub(crate) fn path(&self, key: &str) -> String {
        format!("{}.{key}", self.path)
    }

    /// The value of `key`, unless absent or null; `key` counts as implemented.
    pub(crate) fn get(&mut self, key: &'static str) -> Option<&'v JsonValue> {
        self.read.push(key);
        self.map?.get(key).filter(|v| !v.is_null())
    }

    /// Accepts `key` without reading it (an argument that cannot change the answer).
    pub(crate) fn ignore(&mut self, key: &'static str) {
        self.read.push(key);
    }

    /// The nested input object at `key`, if given.
    pub(crate) fn child(&mut self, key: &'static str) -> Result<Option<Input<'v>>, String> {
        let path = self.path(key);
        match self.get(key) {
            None => Ok(None),
            value => Input::new(value, &path).map(Some),
        }
    }

    /// A string at `key`.
    pub(crate) fn string(&mut self, key: &'static str) -> Result<Option<&'v str>, String> {
        let path = self.path(key);
        self.get(key).map(|v| v.as_str().ok_or_else(|| format!("`{path}` must be a string"))).transpose()
    }

    /// A boolean at `key`.
    pub(crate) fn boolean(&mut self, key: &'static str) -> Result<Option<bool>, String> {
        let path = self.path(key);
        self.get(key).map(|v| v.as_bool().ok_or_else(|| format!("`{path}` must be a boolean"))).transpose()
    }

    /// A list of strings at `key` (a single string is a list of one, as GraphQL coerces it).
    pub(crate) fn strings(&mut self, key: &'static str) -> Result<Option<Vec<String>>, String> {
        let path = self.path(key);
        let Some(value) = self.get(key) else { return Ok(None) };
        let items = value.as_array().map(Vec::as_slice).unwrap_or(std::slice::from_ref(value));
        let strings = items
            .iter()
            .map(|v| v.as_str().map(str::to_string).ok_or_else(|| format!("`{path}` must be a list of strings")));
        strings.collect::<Result<Vec<_>, _>>().map(Some)
    }

    /// The nested input objects of the list at `key`.
    pub(crate) fn list(&mut self, key: &'static str) -> Result<Vec<Input<'v>>, String> {
        let path = self.path(key);
        let Some(value) = self.get(key) else { return Ok(Vec::new()) };
        let items = value.as_array().map(Vec::as_slice).unwrap_or(std::slice::from_ref(value));
        items.iter().enumerate().map(|(i, item)| Input::new(Some(item), &format!("{path}[{i}]"))).collect()
    }

    /// Refuses any key with a value that was not read.
    pub(crate) fn finish(self) -> Result<(), String> {
        let Some(map) = self.map else { return Ok(()) };
        let unread = map.iter().find(|(key, value)| !value.is_null() && !self.read.contains(&key.as_str()));
        match unread {
            Some((key, _)) => Err(unimplemented(&self.path(key.as_str()))),
            None => Ok(()),
        }
    }
}
