//! The tags the shop gives a response (`shop.cache.tag_header`, by default
//! `Surrogate-Key`), by which an operator purges every page that shows,
//! say, product 42 at once (`{"tag": "product-42"}`).
//!
//! Tags are read when a response is stored (and again when a `304` renews
//! it) and kept with the stored entry, so the index lives and dies with the
//! entries: eviction, expiry and purges free a response's tags with it, and
//! nothing about a URL outlives its copy. A purge by tag looks through the
//! entries like a purge by prefix (both are rare operator actions).
//!
//! Bounded: at most [`MAX_TAGS`] tags per response, each at most
//! [`MAX_PURGE_TAG_BYTES`](flashgate_common::keys::MAX_PURGE_TAG_BYTES) visible ASCII characters; tags past the first
//! [`MAX_TAGS`], too long or holding other bytes are not indexed (they
//! could not be purged either: the purge API refuses them). Spaces and
//! commas both separate tags, so `Surrogate-Key` (space-separated) and
//! `Cache-Tag` (comma-separated) read alike.

use flashgate_common::keys::valid_purge_tag;
use pingora::http::ResponseHeader;

/// Most tags indexed per response.
pub const MAX_TAGS: usize = 32;

/// The tags of one stored response, without duplicates.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tags(Box<[Box<str>]>);

impl Tags {
    /// The tags in every `name` header of `response`.
    pub fn of(response: &ResponseHeader, name: &str) -> Self {
        Self::parse(response.headers.get_all(name).iter().map(|v| v.as_bytes()))
    }

    /// The tags in these header values.
    pub fn parse<'a>(values: impl Iterator<Item = &'a [u8]>) -> Self {
        let mut tags: Vec<Box<str>> = Vec::new();
        for value in values {
            for word in value.split(|b| *b == b' ' || *b == b',' || *b == b'\t') {
                if tags.len() == MAX_TAGS {
                    return Self(tags.into());
                }
                let Ok(tag) = std::str::from_utf8(word) else {
                    continue;
                };
                if valid_purge_tag(tag) && !tags.iter().any(|t| &**t == tag) {
                    tags.push(tag.into());
                }
            }
        }
        Self(tags.into())
    }

    pub fn contains(&self, tag: &str) -> bool {
        self.0.iter().any(|t| &**t == tag)
    }

    /// Bytes the tags hold, counted in the entry's weight.
    pub fn bytes(&self) -> usize {
        self.0.iter().map(|t| t.len() + 16).sum()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flashgate_common::keys::MAX_PURGE_TAG_BYTES;

    fn parse(values: &[&str]) -> Tags {
        Tags::parse(values.iter().map(|v| v.as_bytes()))
    }

    #[test]
    fn spaces_and_commas_both_separate_tags() {
        let tags = parse(&["product-42 category-7", "a,b, c"]);
        assert_eq!(tags.len(), 5);
        for t in ["product-42", "category-7", "a", "b", "c"] {
            assert!(tags.contains(t), "{t}");
        }
        assert!(!tags.contains("product"));
        assert!(parse(&[" , ,"]).is_empty());
    }

    #[test]
    fn the_tags_of_one_response_are_bounded_in_number_and_length() {
        let many: Vec<String> = (0..1000).map(|i| format!("t{i}")).collect();
        let tags = parse(&[&many.join(" ")]);
        assert_eq!(tags.len(), MAX_TAGS);
        assert!(tags.contains("t0") && !tags.contains(&format!("t{MAX_TAGS}")));
        let long = "x".repeat(MAX_PURGE_TAG_BYTES + 1);
        let tags = parse(&[&format!("{long} ok caf\u{e9} ok")]);
        assert_eq!(
            tags.len(),
            1,
            "too long, non-ASCII and repeated tags are not indexed"
        );
        assert!(tags.bytes() < 64);
    }

    #[test]
    fn tags_are_read_from_the_configured_header_only() {
        let mut resp = ResponseHeader::build(200, None).unwrap();
        resp.append_header("surrogate-key", "p1 p2").unwrap();
        resp.append_header("surrogate-key", "p3").unwrap();
        resp.append_header("cache-tag", "other").unwrap();
        let tags = Tags::of(&resp, "surrogate-key");
        assert_eq!(tags.len(), 3);
        assert!(!tags.contains("other"));
        assert!(Tags::of(&resp, "cache-tag").contains("other"));
    }
}
