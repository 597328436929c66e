//! The heads and bodies of the rejections each thread wrote last, kept so
//! that the next same rejection is cloned, as a static page's head is,
//! instead of built again.
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

use pingora::http::ResponseHeader;

use super::session::reply_head;
use crate::edge::reply::Reply;
use crate::edge::static_pages::Page;
use crate::rejection::Rejection;

/// Answers kept per thread: more kinds than a flood has at once, few
/// enough to search in a glance.
const KEPT: usize = 8;

thread_local! {
    static KEPT_ANSWERS: RefCell<VecDeque<(Rejection, ResponseHeader, bytes::Bytes)>> =
        const { RefCell::new(VecDeque::new()) };
}

/// `rejection`'s answer without its request id: a clone of the one kept
/// for it, else built and kept. `None` for a rejection never kept (a
/// challenge): the caller builds its reply.
///
/// # Errors
/// Pingora's error when the answer's head cannot be built.
pub fn kept_answer(rejection: &Rejection) -> Option<pingora::Result<Page>> {
    let key = key(rejection)?;
    KEPT_ANSWERS.with(|kept| {
        // Never borrowed twice: nothing below writes an answer.
        let mut kept = kept.try_borrow_mut().ok()?;
        if let Some((_, head, body)) = kept.iter().find(|(r, ..)| *r == key) {
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

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use flashgate_common::config::Bucket;

    use super::*;
    use crate::admission::{AuthError, Limited, RouteClass, Scope};

    fn built(rejection: &Rejection) -> (u16, http::HeaderMap, bytes::Bytes) {
        let (head, body) = reply_head(Reply::from(rejection.clone())).unwrap();
        (head.status.as_u16(), head.headers.clone(), body)
    }

    fn kept(rejection: &Rejection) -> (u16, http::HeaderMap, bytes::Bytes) {
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
}
