//! The heads of the gateway's own answers: built from a [`Reply`]
//! ([`reply_head`]), and for rejections kept per thread, so that the next
//! same rejection is cloned, as a static page's head is, instead of built
//! again ([`kept_answer`]). The request id is added as each is written
//! (`session::write_page`).
//!
//! A flood is the same few answers over and over (one sold out, one
//! missing token, one hammering user's 429), and building one (its JSON
//! body, then a header map filled name by name) cost a rejection more
//! than the rest of its head. An answer is a pure function of its
//! [`Rejection`] (`reply`), so the rejection is its own key; a 429's
//! bucket wait is kept in whole seconds, all its headers say. A challenge
//! is new every time and never kept.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE};
use http::HeaderValue;
use pingora::http::ResponseHeader;

use crate::edge::reply::Reply;
use crate::edge::static_pages::Page;
use crate::rejection::Rejection;

/// Answers kept per thread: more kinds than a flood has at once, few
/// enough to search in a glance.
const KEPT: usize = 8;

thread_local! {
    static KEPT_ANSWERS: RefCell<VecDeque<(Rejection, ResponseHeader, Bytes)>> =
        const { RefCell::new(VecDeque::new()) };
}

/// `rejection`'s answer without its request id: a clone of the one kept
/// for it, else built and kept. `None` for a rejection never kept (a
/// challenge), or should this thread's answers be in use (nothing here
/// calls back into them): the caller builds its reply.
///
/// # Errors
/// Pingora's error when the answer's head cannot be built.
pub fn kept_answer(rejection: &Rejection) -> Option<pingora::Result<Page>> {
    let key = key(rejection)?;
    KEPT_ANSWERS.with(|kept| {
        // Never borrowed twice: nothing below writes an answer.
        let mut kept = kept.try_borrow_mut().ok()?;
        if let Some(at) = kept.iter().position(|(r, ..)| *r == key) {
            // To the front: a key of the moment (a 429's second, a
            // countdown's) pushes out the answers least used, not the
            // busiest.
            if at > 0 {
                let entry = kept.remove(at)?;
                kept.push_front(entry);
            }
            let (_, head, body) = &kept[0];
            return Some(Ok(Page {
                head: Box::new(head.clone()),
                body: body.clone(),
            }));
        }
        let (head, body) = match reply_head(Reply::from(key.clone())) {
            Ok(built) => built,
            Err(error) => return Some(Err(error)),
        };
        if kept.len() == KEPT {
            kept.pop_back();
        }
        kept.push_front((key, head.clone(), body.clone()));
        Some(Ok(Page {
            head: Box::new(head),
            body,
        }))
    })
}

/// The rejection an answer is kept under, `None` for one never kept.
fn key(rejection: &Rejection) -> Option<Rejection> {
    match rejection {
        Rejection::ChallengeRequired(..) => None,
        Rejection::RateLimited(limited) => {
            let mut limited = limited.clone();
            limited.retry_after = Duration::from_secs(limited.retry_after_secs());
            Some(Rejection::RateLimited(limited))
        }
        other => Some(other.clone()),
    }
}

/// A reply as its head, without the request id, and its body. The head's
/// header map is filled directly with prebuilt names: Pingora's
/// `append_header` parses every name it is given, which cost more than
/// the rest of a rejection's head. Built without the map of names as
/// written, as `ResponseHeader::build_no_case` would: over HTTP/1.1
/// Pingora then writes a dozen common names (Content-Type,
/// Content-Length, Cache-Control, ...) capitalised and every other one in
/// lower case, as HTTP/2 always does (names are case-insensitive, RFC 9110
/// §5.1). The reply's own headers replace these defaults.
pub(super) fn reply_head(reply: Reply) -> pingora::Result<(ResponseHeader, Bytes)> {
    let mut head = http::Response::new(()).into_parts().0;
    head.status = http::StatusCode::from_u16(reply.status).map_err(invalid("reply status"))?;
    let map = &mut head.headers;
    // Room for the request id too, appended as the answer is written.
    map.try_reserve(reply.headers.len() + 4)
        .map_err(invalid("reply head"))?;
    let defaults = [
        (CONTENT_TYPE, HeaderValue::from_static(reply.content_type)),
        (CONTENT_LENGTH, HeaderValue::from(reply.body.len())),
    ];
    let json = (reply.content_type == "application/json")
        .then(|| (CACHE_CONTROL, HeaderValue::from_static("no-store")));
    for (name, value) in defaults.into_iter().chain(json) {
        map.try_append(name, value).map_err(invalid("reply head"))?;
    }
    for (name, value) in reply.headers {
        let value = HeaderValue::try_from(value).map_err(invalid("reply header"))?;
        map.try_insert(name, value).map_err(invalid("reply head"))?;
    }
    Ok((ResponseHeader::from(head), reply.body))
}

/// Maps an error building an answer of our own (not the client's fault)
/// to Pingora's internal error, naming `what` was being built.
pub(super) fn invalid<E>(what: &'static str) -> impl Fn(E) -> Box<pingora::Error>
where
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    move |e| pingora::Error::because(pingora::ErrorType::InternalError, what, e)
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use flashgate_common::config::Bucket;

    use super::*;
    use crate::admission::{AuthError, Limited, RouteClass, Scope};

    fn built(rejection: &Rejection) -> (u16, http::HeaderMap, Bytes) {
        let (head, body) = reply_head(Reply::from(rejection.clone())).unwrap();
        (head.status.as_u16(), head.headers.clone(), body)
    }

    fn kept(rejection: &Rejection) -> (u16, http::HeaderMap, Bytes) {
        let page = kept_answer(rejection).unwrap().unwrap();
        (
            page.head.status.as_u16(),
            page.head.headers.clone(),
            page.body,
        )
    }

    fn limited(retry_after: Duration) -> Rejection {
        Rejection::RateLimited(Limited {
            class: RouteClass::Buy,
            scope: Scope::User,
            bucket: Bucket {
                per_second: NonZeroU32::new(1).unwrap(),
                burst: NonZeroU32::new(10).unwrap(),
            },
            retry_after,
        })
    }

    #[test]
    fn a_kept_answer_is_the_answer_built_for_the_same_rejection() {
        let rejections = [
            Rejection::SoldOut,
            Rejection::Unauthorized(AuthError::Missing),
            Rejection::Unauthorized(AuthError::Invalid),
            Rejection::NotStarted(42),
            Rejection::BadRequest("body must be empty or a JSON object"),
            limited(Duration::from_millis(1_400)),
        ];
        // Twice over: built and kept the first time, cloned the second.
        for _ in 0..2 {
            for rejection in &rejections {
                assert_eq!(kept(rejection), built(rejection), "{rejection:?}");
            }
        }
    }

    #[test]
    fn kept_answers_carry_their_status_headers_and_json_body() {
        for _ in 0..2 {
            let (status, headers, body) = kept(&Rejection::SoldOut);
            assert_eq!(status, 410);
            assert_eq!(&body[..], br#"{"code":"sold_out","message":"sold out"}"#);
            assert_eq!(headers[CONTENT_TYPE], "application/json");
            assert_eq!(headers[CONTENT_LENGTH], body.len().to_string().as_str());
            assert_eq!(headers[CACHE_CONTROL], "no-store");
            let (status, headers, _) = kept(&Rejection::Unauthorized(AuthError::Missing));
            assert_eq!(status, 401);
            assert_eq!(
                headers[http::header::WWW_AUTHENTICATE],
                flashgate_common::secret::BEARER_CHALLENGE
            );
            let (status, headers, _) = kept(&limited(Duration::from_millis(300)));
            assert_eq!(status, 429);
            assert_eq!(headers[http::header::RETRY_AFTER], "1");
            assert_eq!(headers["ratelimit"], r#""buy-user";r=0;t=1"#);
            assert_eq!(headers["ratelimit-policy"], r#""buy-user";q=10;w=10"#);
        }
    }

    #[test]
    fn a_429_is_kept_by_the_whole_seconds_it_says_to_wait() {
        let (_, first, _) = kept(&limited(Duration::from_millis(1_100)));
        let (_, same_second, _) = kept(&limited(Duration::from_millis(1_900)));
        let (_, next_second, _) = kept(&limited(Duration::from_millis(2_100)));
        assert_eq!(first, same_second);
        assert_eq!(first[http::header::RETRY_AFTER], "2");
        assert_eq!(next_second[http::header::RETRY_AFTER], "3");
        assert_eq!(
            KEPT_ANSWERS.with(|k| k.borrow().len()),
            2,
            "one answer kept per whole second"
        );
    }

    #[test]
    fn a_challenge_is_never_kept_and_the_kept_answers_stay_few() {
        use crate::admission::token::{Issued, Refusal};
        let issued = Issued {
            challenge: "c".repeat(72),
            difficulty_bits: 14,
            expires_at_ms: 1_800_000_000_000,
        };
        let challenge = Rejection::ChallengeRequired(Box::new(issued), Refusal::Replayed);
        assert!(kept_answer(&challenge).is_none());
        for secs in 0..2 * KEPT as u64 {
            kept(&Rejection::NotStarted(secs));
        }
        assert_eq!(KEPT_ANSWERS.with(|k| k.borrow().len()), KEPT);
    }

    #[test]
    fn an_answer_in_use_outlasts_keys_of_the_moment() {
        let holds_sold_out =
            || KEPT_ANSWERS.with(|k| k.borrow().iter().any(|(r, ..)| *r == Rejection::SoldOut));
        kept(&Rejection::SoldOut);
        // A countdown's answers come and go while sold out is still asked,
        // every few of them.
        for secs in 0..3 * KEPT as u64 {
            kept(&Rejection::NotStarted(secs));
            assert!(holds_sold_out(), "pushed out after {secs}");
            if secs % 4 == 3 {
                kept(&Rejection::SoldOut);
            }
        }
        for secs in 0..KEPT as u64 {
            kept(&Rejection::NotStarted(100 + secs));
        }
        assert!(!holds_sold_out(), "unused, it went like any other");
    }
}
