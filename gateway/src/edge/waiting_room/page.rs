//! What a visitor not let in sees: the queue page (HTML, from the room's
//! template) or, for `Accept: application/json`, the same facts as JSON;
//! `Retry-After` and `Cache-Control: no-store` on both.
//!
//! A template is an HTML file with these placeholders, each replaced
//! wherever it appears: `{{title}}`, `{{message}}`, `{{place}}`,
//! `{{waiting}}`, `{{wait}}` (the estimated wait in words),
//! `{{refresh_seconds}}`, `{{room}}`, and `{{script}}`: the gateway's
//! script, which counts down in the element `#fg-countdown`, reloads the
//! page when it reaches zero (the reload lets the visitor in when their
//! turn has come), and solves the proof of work a room may ask for.

use bytes::Bytes;
use serde_json::json;

use crate::admission::token::Issued;
use crate::edge::reply::Reply;

/// The built-in queue page.
pub const DEFAULT_TEMPLATE: &str = include_str!("queue.html");

/// The cookie the page's script stores a proof-of-work solution in (a `.`,
/// which no room name holds, keeps it apart from the rooms' cookies).
pub const POW_COOKIE: &str = "fg_room.pow";

/// What the visitor is shown.
#[derive(Debug, Clone)]
pub enum Shown {
    /// Waiting at `place` of `waiting`; the wait estimated from the
    /// measured admission rate (`None` before anyone was let in);
    /// `opens_at_ms` while the room has not started.
    Queued {
        place: u64,
        waiting: u64,
        wait_seconds: Option<u64>,
        opens_at_ms: Option<i64>,
    },
    /// A proof of work owed before a place is given.
    Proving(Issued),
    /// `reject` mode and no space: `503`.
    Full,
    /// The room's Redis did not answer: `503`, try again.
    Unavailable,
}

/// One room's page: its template and what the script needs.
pub struct Page {
    pub room: String,
    pub template: String,
    /// `{prefix}/static/pow.js`, the proof-of-work worker of the sale page.
    pub worker: String,
    pub refresh_seconds: u64,
}

/// The estimated wait in words.
fn in_words(wait_seconds: Option<u64>) -> String {
    match wait_seconds {
        None => "being measured".into(),
        Some(s) if s < 45 => "less than a minute".into(),
        Some(s) if s <= 60 => "about a minute".into(),
        Some(s) if s < 3600 => format!("about {} minutes", s.div_ceil(60)),
        Some(s) => format!("about {} hours", s.div_ceil(3600)),
    }
}

impl Page {
    /// The answer for `shown`, JSON when `json`.
    pub fn answer(&self, shown: &Shown, json: bool) -> Reply {
        let status = match shown {
            Shown::Queued { .. } | Shown::Proving(_) => 200,
            Shown::Full | Shown::Unavailable => 503,
        };
        let reply = if json {
            Reply::json(status, &self.json(shown))
        } else {
            Reply {
                status,
                content_type: "text/html; charset=utf-8",
                headers: Vec::new(),
                body: Bytes::from(self.html(shown)),
            }
        };
        reply
            .header(http::header::RETRY_AFTER, self.refresh_seconds.to_string())
            .header(http::header::CACHE_CONTROL, "no-store")
    }

    fn json(&self, shown: &Shown) -> serde_json::Value {
        let room = &self.room;
        let refresh = self.refresh_seconds;
        match shown {
            Shown::Queued {
                place,
                waiting,
                wait_seconds,
                opens_at_ms,
            } => json!({
                "room": room,
                "status": "queued",
                "place": place,
                "waiting": waiting,
                "estimated_wait_seconds": wait_seconds,
                "opens_at": opens_at_ms.map(flashgate_common::rfc3339),
                "refresh_seconds": refresh,
            }),
            Shown::Proving(issued) => json!({
                "room": room,
                "status": "challenge",
                "challenge": issued.challenge,
                "difficulty_bits": issued.difficulty_bits,
                "expires_at": flashgate_common::rfc3339(issued.expires_at_ms),
                "refresh_seconds": refresh,
            }),
            Shown::Full => json!({
                "code": "room_full",
                "message": "the shop is full right now: try again later",
                "room": room,
                "retry_after_seconds": refresh,
            }),
            Shown::Unavailable => json!({
                "code": "unavailable",
                "message": "the waiting room cannot give places right now: try again shortly",
                "room": room,
                "retry_after_seconds": refresh,
            }),
        }
    }

    fn html(&self, shown: &Shown) -> String {
        let (title, message, place, waiting, wait) = match shown {
            Shown::Queued {
                place,
                waiting,
                wait_seconds,
                opens_at_ms,
            } => (
                "You are in line",
                match opens_at_ms {
                    Some(at) => format!(
                        "The shop opens at {}. Everyone who arrives before then gets a place in line.",
                        flashgate_common::rfc3339(*at)
                    ),
                    None => "The shop is busy. You will be let in when your turn comes.".into(),
                },
                place.to_string(),
                waiting.to_string(),
                in_words(*wait_seconds),
            ),
            Shown::Proving(_) => (
                "Just a moment",
                "Your browser is checking in before it gets a place in line.".into(),
                "…".into(),
                "…".into(),
                "being measured".into(),
            ),
            Shown::Full => (
                "The shop is full",
                "Too many visitors are in the shop right now. Please try again later.".into(),
                "–".into(),
                "–".into(),
                "unknown".into(),
            ),
            Shown::Unavailable => (
                "Please wait",
                "The line cannot be reached right now. This page tries again by itself.".into(),
                "–".into(),
                "–".into(),
                "unknown".into(),
            ),
        };
        let data = json!({
            "refresh": self.refresh_seconds,
            "challenge": match shown { Shown::Proving(i) => Some(&i.challenge), _ => None },
            "bits": match shown { Shown::Proving(i) => i.difficulty_bits, _ => 0 },
            "worker": self.worker,
            "cookie": POW_COOKIE,
        });
        // `</` cannot appear in the JSON of these values, but escape it anyway.
        let script = SCRIPT.replace("{{data}}", &data.to_string().replace("</", "<\\/"));
        self.template
            .replace("{{title}}", title)
            .replace("{{message}}", &message)
            .replace("{{place}}", &place)
            .replace("{{waiting}}", &waiting)
            .replace("{{wait}}", &wait)
            .replace("{{refresh_seconds}}", &self.refresh_seconds.to_string())
            .replace("{{room}}", &self.room)
            .replace("{{script}}", &script)
    }
}

/// The page's script: the countdown and reload, or the proof of work.
const SCRIPT: &str = r#"<script>
(function () {
  var d = {{data}};
  var left = d.refresh;
  var counter = document.getElementById('fg-countdown');
  function tick() {
    if (counter) counter.textContent = String(left);
    if (left <= 0) { location.reload(); return; }
    left -= 1;
    setTimeout(tick, 1000);
  }
  if (d.challenge) {
    var worker = new Worker(d.worker);
    worker.onmessage = function (e) {
      document.cookie = d.cookie + '=' + e.data.header + '; path=/; SameSite=Lax';
      location.reload();
    };
    worker.postMessage({ challenge: d.challenge, bits: d.bits });
  } else {
    // A hidden tab's timers may run once a minute: shown again, it asks at once.
    document.addEventListener('visibilitychange', function () {
      if (!document.hidden) location.reload();
    });
    tick();
  }
})();
</script>"#;

#[cfg(test)]
mod tests {
    use super::*;

    fn page() -> Page {
        Page {
            room: "checkout".into(),
            template: DEFAULT_TEMPLATE.into(),
            worker: "/flashgate/static/pow.js".into(),
            refresh_seconds: 7,
        }
    }

    #[test]
    fn the_queue_page_shows_the_place_the_wait_and_the_refresh() {
        let shown = Shown::Queued {
            place: 42,
            waiting: 900,
            wait_seconds: Some(150),
            opens_at_ms: None,
        };
        let reply = page().answer(&shown, false);
        assert_eq!(reply.status, 200);
        let body = String::from_utf8(reply.body.to_vec()).unwrap();
        assert!(body.contains(r#"id="fg-place">42<"#), "{body}");
        assert!(body.contains("about 3 minutes"), "{body}");
        assert!(!body.contains("{{"), "a placeholder is left: {body}");
        assert!(reply
            .headers
            .contains(&(http::header::RETRY_AFTER, "7".into())));
        let json = page().answer(&shown, true);
        let value: serde_json::Value = serde_json::from_slice(&json.body).unwrap();
        assert_eq!(value["place"], 42);
        assert_eq!(value["estimated_wait_seconds"], 150);
        assert_eq!(value["refresh_seconds"], 7);
    }

    #[test]
    fn a_full_room_is_a_503_with_a_json_error() {
        let reply = page().answer(&Shown::Full, true);
        assert_eq!(reply.status, 503);
        let value: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
        assert_eq!(value["code"], "room_full");
    }
}
