//! Relay-style pagination as Linear does it: `first` (default 50, at most 250) and an opaque
//! `after` cursor, `pageInfo { hasNextPage endCursor }`. A cursor names the sort key of the
//! last node handed out, so the next page starts after it even if nodes were added meanwhile.
//! `last` and `before` (backward paging) are refused as not implemented.

use super::input::{unimplemented, Input};

/// Linear's default page size.
const DEFAULT_FIRST: i64 = 50;
/// Linear's largest page.
const MAX_FIRST: i64 = 250;

/// A connection's `pageInfo`.
#[derive(Debug, Clone, Default)]
pub(crate) struct PageInfo {
    pub has_next_page: bool,
    pub has_previous_page: bool,
    pub start_cursor: Option<String>,
    pub end_cursor: Option<String>,
}

/// The paging arguments of one connection field.
#[derive(Debug)]
pub(crate) struct PageArgs {
    first: usize,
    /// The decoded sort key of `after`.
    after: Option<String>,
}

impl PageArgs {
    /// Reads `first`, `after` (and accepts `includeArchived`: nothing is archived here) from
    /// the field's arguments; refuses `last` and `before`.
    pub(crate) fn read(args: &mut Input<'_>) -> Result<Self, String> {
        args.ignore("includeArchived");
        for backward in ["last", "before"] {
            if args.get(backward).is_some() {
                return Err(unimplemented(&args.path(backward)));
            }
        }
        let first = args.get("first").map(|v| v.as_i64().unwrap_or(-1)).unwrap_or(DEFAULT_FIRST);
        if !(0..=MAX_FIRST).contains(&first) {
            return Err(format!(
                "Argument Validation Error: `{}` must be between 0 and {MAX_FIRST}, got {first}",
                args.path("first")
            ));
        }
        let after = args.string("after")?.map(decode).transpose()?;
        Ok(Self { first: usize::try_from(first).unwrap_or(0), after })
    }
}

/// One page of `items` (each with its sort key, already in order: ascending keys, or
/// descending when `descending`), with each node's cursor.
pub(crate) fn page<T>(items: Vec<(String, T)>, descending: bool, args: &PageArgs) -> (Vec<(String, T)>, PageInfo) {
    let has_previous_page = args.after.is_some();
    let mut rest = items.into_iter().filter(|(key, _)| match &args.after {
        None => true,
        Some(after) if descending => key < after,
        Some(after) => key > after,
    });
    let nodes: Vec<(String, T)> = rest.by_ref().take(args.first).map(|(key, node)| (encode(&key), node)).collect();
    let has_next_page = rest.next().is_some();
    let start_cursor = nodes.first().map(|(c, _)| c.clone());
    let end_cursor = nodes.last().map(|(c, _)| c.clone());
    (nodes, PageInfo { has_next_page, has_previous_page, start_cursor, end_cursor })
}

/// The opaque form of a sort key.
fn encode(key: &str) -> String {
    key.bytes().map(|b| format!("{b:02x}")).collect()
}

/// The sort key of an opaque cursor.
fn decode(cursor: &str) -> Result<String, String> {
    let invalid = || format!("Argument Validation Error: invalid cursor {cursor:?}");
    let byte = |pair: &[u8]| {
        std::str::from_utf8(pair).ok().filter(|p| p.len() == 2).and_then(|p| u8::from_str_radix(p, 16).ok())
    };
    let bytes = cursor.as_bytes().chunks(2).map(byte).collect::<Option<Vec<u8>>>().ok_or_else(invalid)?;
    String::from_utf8(bytes).map_err(|_| invalid())
}
