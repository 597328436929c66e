//! The proof-of-work challenge of buys against the real stack: a buy
//! without a solution gets 428 with a challenge, a solution buys once (on
//! any gateway), every kind of bad solution is refused and takes nothing,
//! the adaptive difficulty follows a burst, and mode "off" changes nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use flashgate_gateway::admission::token::{solution_bits, solve, Signer};
use flashgate_tests::{token, Stack, StackOptions, CHALLENGE_SECRET};
use serde_json::Value;

/// Sends a buy as `user` with optional `Flashgate-Pow` and Idempotency-Key
/// to the gateway at `base`; status, replay header and JSON body.
async fn buy_at(
    stack: &Stack,
    base: &str,
    sale: &str,
    user: &str,
    pow: Option<&str>,
    key: Option<&str>,
) -> (u16, bool, Value) {
    let mut req = stack
        .http
        .post(format!("{base}/flashgate/api/sales/{sale}/buy"))
        .bearer_auth(token(user))
        .timeout(Duration::from_secs(10));
    if let Some(p) = pow {
        req = req.header("Flashgate-Pow", p);
    }
    if let Some(k) = key {
        req = req.header("Idempotency-Key", k);
    }
    let resp = req.send().await.unwrap();
    let (status, replayed) = (
        resp.status().as_u16(),
        resp.headers().contains_key("idempotent-replayed"),
    );
    (status, replayed, resp.json().await.unwrap_or(Value::Null))
}

async fn buy(
    stack: &Stack,
    sale: &str,
    user: &str,
    pow: Option<&str>,
    key: Option<&str>,
) -> (u16, bool, Value) {
    buy_at(stack, &stack.url(""), sale, user, pow, key).await
}

/// `GET /flashgate/api/sales/{sale}/challenge` as `user`: status and JSON.
async fn fetch_challenge(stack: &Stack, sale: &str, user: &str) -> (u16, Value) {
    let resp = stack
        .http
        .get(stack.url(&format!("/flashgate/api/sales/{sale}/challenge")))
        .bearer_auth(token(user))
        .send()
        .await
        .unwrap();
    (
        resp.status().as_u16(),
        resp.json().await.unwrap_or(Value::Null),
    )
}

/// A solution of the challenge in a 428 or challenge answer.
fn solution(v: &Value) -> String {
    solve(
        v["challenge"].as_str().unwrap(),
        v["difficulty_bits"].as_u64().unwrap() as u8,
        0,
    )
}

fn assert_challenge_required(
    case: &str,
    (status, _, body): &(u16, bool, Value),
    message_part: &str,
) {
    assert_eq!(
        (*status, body["code"].as_str()),
        (428, Some("challenge_required")),
        "{case}: {body}"
    );
    assert!(
        body["message"].as_str().unwrap().contains(message_part),
        "{case}: {body}"
    );
    assert_eq!(
        body["challenge"].as_str().map(str::len),
        Some(72),
        "{case}: a fresh challenge comes with it: {body}"
    );
}

fn assert_sold_out(case: &str, (status, _, body): &(u16, bool, Value)) {
    assert_eq!(
        (*status, body["code"].as_str()),
        (410, Some("sold_out")),
        "{case}: {body}"
    );
}

/// `name{reason="..."} N` of the gateway's challenge rejections.
async fn rejections(stack: &Stack) -> BTreeMap<String, u64> {
    let text = stack.gateway_metrics_text().await;
    text.lines()
        .filter_map(|l| l.strip_prefix("flashgate_challenges_rejected_total{reason=\""))
        .filter_map(|rest| {
            rest.split_once("\"} ")
                .map(|(r, n)| (r.to_owned(), n.parse().unwrap()))
        })
        .collect()
}

async fn metric(stack: &Stack, name: &str) -> String {
    let text = stack.gateway_metrics_text().await;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")).map(str::to_owned))
        .unwrap_or_default()
}

fn always(bits: u32) -> StackOptions {
    StackOptions {
        extra_toml: format!(
            "[challenge]\nmode = \"always\"\ndifficulty_bits = {bits}\nttl_seconds = 60\n"
        ),
        ..StackOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buy_without_a_solution_gets_428_and_a_solution_buys_once() {
    let stack = Stack::start(always(8)).await;
    stack.open_sale("pow", 10, 1).await;
    stack.open_sale("pow-b", 10, 1).await;

    let first = buy(&stack, "pow", "alice", None, None).await;
    assert_challenge_required("no solution", &first, "proof of work");
    let body = first.2.as_object().unwrap();
    let mut keys: Vec<&str> = body.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "challenge",
            "code",
            "difficulty_bits",
            "expires_at",
            "message"
        ],
        "{body:?}"
    );
    assert_eq!(first.2["difficulty_bits"], 8);
    let expires =
        flashgate_common::parse_rfc3339("expires_at", first.2["expires_at"].as_str().unwrap())
            .unwrap();
    assert!(
        expires > flashgate_common::now_ms(),
        "expires in the future: {}",
        first.2["expires_at"]
    );

    let pow = solution(&first.2);
    let won = buy(&stack, "pow", "alice", Some(&pow), None).await;
    assert_eq!(won.0, 202, "{}", won.2);
    assert_challenge_required(
        "replayed",
        &buy(&stack, "pow", "alice", Some(&pow), None).await,
        "already used",
    );

    // Fetched ahead (as the sale page does), then used by someone else or elsewhere.
    let (status, ahead) = fetch_challenge(&stack, "pow", "bob").await;
    assert_eq!(status, 200, "{ahead}");
    let mut fields: Vec<&str> = ahead
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    fields.sort_unstable();
    assert_eq!(fields, ["challenge", "difficulty_bits", "expires_at"]);
    let bobs = solution(&ahead);
    assert_challenge_required(
        "another user",
        &buy(&stack, "pow", "carol", Some(&bobs), None).await,
        "another user",
    );
    assert_challenge_required(
        "another sale",
        &buy(&stack, "pow-b", "bob", Some(&bobs), None).await,
        "another sale",
    );

    // A changed character of the challenge: its tag no longer matches.
    let (challenge, _) = bobs.rsplit_once('.').unwrap();
    let last = if challenge.ends_with('A') { 'B' } else { 'A' };
    let forged = format!("{}{last}", &challenge[..challenge.len() - 1]);
    let forged = solve(&forged, 8, 0);
    assert_challenge_required(
        "forged",
        &buy(&stack, "pow", "bob", Some(&forged), None).await,
        "not issued",
    );

    // Signed with the gateways' secret, but already expired.
    let signer = Signer::new(CHALLENGE_SECRET.as_bytes());
    let old = signer.issue(
        "bob",
        "pow",
        8,
        flashgate_common::now_ms() - 1000,
        rand::random(),
    );
    let expired = solve(&old.challenge, 8, 0);
    assert_challenge_required(
        "expired",
        &buy(&stack, "pow", "bob", Some(&expired), None).await,
        "expired",
    );

    // The right challenge with a nonce whose hash is not good enough.
    let weak = (0u64..)
        .map(|n| format!("{challenge}.{n}"))
        .find(|h| solution_bits(h.as_bytes()) < 8)
        .unwrap();
    assert_challenge_required(
        "too easy",
        &buy(&stack, "pow", "bob", Some(&weak), None).await,
        "leading zero bits",
    );

    // Bad syntax is a 400 and takes nothing.
    let before = (stack.remaining("pow").await, stack.stream_len("pow").await);
    for bad in [
        "garbage",
        "a.b",
        &format!("{challenge}."),
        &format!("{challenge}.{}", "9".repeat(65)),
        &format!("{challenge}.n o"),
    ] {
        let (status, _, body) = buy(&stack, "pow", "bob", Some(bad), None).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (400, Some("bad_request")),
            "{bad}: {body}"
        );
        assert!(
            body["message"].as_str().unwrap().contains("Flashgate-Pow"),
            "{body}"
        );
    }
    assert_eq!(
        (stack.remaining("pow").await, stack.stream_len("pow").await),
        before,
        "refused buys took nothing"
    );

    // Bob's own solution still buys: nothing above used it up.
    assert_eq!(buy(&stack, "pow", "bob", Some(&bobs), None).await.0, 202);
    assert_eq!(
        (stack.remaining("pow").await, stack.stream_len("pow").await),
        (8, 2),
        "two winners, two items"
    );

    let seen = rejections(&stack).await;
    for (reason, n) in [
        ("missing", 1),
        ("replayed", 1),
        ("other_user", 1),
        ("other_sale", 1),
        ("forged", 1),
        ("expired", 1),
        ("too_easy", 1),
        ("malformed", 5),
    ] {
        assert_eq!(seen.get(reason).copied(), Some(n), "{reason}: {seen:?}");
    }
    assert_eq!(
        metric(&stack, "flashgate_challenges_solved_total").await,
        "2"
    );
    assert_eq!(
        metric(&stack, "flashgate_challenges_issued_total").await,
        "8",
        "7 refusals with a fresh one, 1 fetched ahead"
    );

    // Without a token there is no challenge either.
    let resp = stack
        .http
        .get(stack.url("/flashgate/api/sales/pow/challenge"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_resend_passes_with_its_solution_and_any_gateway_verifies_but_none_accepts_a_replay(
) {
    let stack = Stack::start(always(6)).await;
    stack.open_sale("resend", 10, 1).await;
    let (gateway2, addr2) = stack.start_second_gateway();
    let base2 = format!("http://{addr2}");

    // A client's retry of the same buy (same key, same solution) gets the
    // first outcome; the same solution with another key is a replay.
    let (_, ahead) = fetch_challenge(&stack, "resend", "dana").await;
    let pow = solution(&ahead);
    let first = buy(&stack, "resend", "dana", Some(&pow), Some("click-1")).await;
    assert_eq!(first.0, 202, "{}", first.2);
    let again = buy_at(
        &stack,
        &base2,
        "resend",
        "dana",
        Some(&pow),
        Some("click-1"),
    )
    .await;
    assert!(again.0 == 202 || again.0 == 201, "{}", again.2);
    assert!(again.1, "answered as a replay of the first: {}", again.2);
    assert_eq!(again.2["reservation_id"], first.2["reservation_id"]);
    assert_challenge_required(
        "other key",
        &buy(&stack, "resend", "dana", Some(&pow), Some("click-2")).await,
        "already used",
    );
    // A few re-sends of one buy, not a way to poll the sale with one solution.
    for _ in 1..flashgate_gateway::admission::MAX_RESENDS {
        assert!(
            buy(&stack, "resend", "dana", Some(&pow), Some("click-1"))
                .await
                .1
        );
    }
    assert_challenge_required(
        "re-sent too often",
        &buy(&stack, "resend", "dana", Some(&pow), Some("click-1")).await,
        "already used",
    );

    // Issued by the first gateway, solved on the second, replayed on the first.
    let (_, ahead) = fetch_challenge(&stack, "resend", "eve").await;
    let pow = solution(&ahead);
    assert_eq!(
        buy_at(&stack, &base2, "resend", "eve", Some(&pow), None)
            .await
            .0,
        202
    );
    assert_challenge_required(
        "replay elsewhere",
        &buy(&stack, "resend", "eve", Some(&pow), None).await,
        "already used",
    );
    assert_eq!(stack.remaining("resend").await, 8);
    drop(gateway2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sold_out_sale_answers_410_before_any_challenge() {
    let stack = Stack::start(always(6)).await;
    stack.open_sale("last-one", 1, 1).await;
    let (_, c) = fetch_challenge(&stack, "last-one", "first").await;
    assert_eq!(
        buy(&stack, "last-one", "first", Some(&solution(&c)), None)
            .await
            .0,
        202
    );
    // The next buyer still solves: only the script can tell the stock is gone.
    let (_, c) = fetch_challenge(&stack, "last-one", "second").await;
    let (status, _, body) = buy(&stack, "last-one", "second", Some(&solution(&c)), None).await;
    assert_eq!((status, body["code"].as_str()), (410, Some("sold_out")));
    // From then on the sold-out flag answers a buy without a key.
    let (status, _, body) = buy(&stack, "last-one", "late", None, None).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (410, Some("sold_out")),
        "{body}"
    );
    // A keyed one of a user who never reserved an item has no win to
    // replay: answered by the flag and the sale's buyers, with no proof.
    let (status, _, body) = buy(&stack, "last-one", "late", None, Some("k-1")).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (410, Some("sold_out")),
        "{body}"
    );
    // A buyer's keyed buy is decided by Redis (it may replay a win): it
    // pays its proof of work like any buy, and gets no second item.
    let keyed = buy(&stack, "last-one", "first", None, Some("k-2")).await;
    assert_challenge_required("buyer's keyed", &keyed, "proof of work");
    let (status, _, body) = buy(
        &stack,
        "last-one",
        "first",
        Some(&solution(&keyed.2)),
        Some("k-2"),
    )
    .await;
    assert!(
        matches!(body["code"].as_str(), Some("sold_out" | "limit_reached")),
        "{status} {body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_another_gateway_sold_out_answers_keyed_non_buyers_410_with_no_challenge() {
    use flashgate_gateway::sales::{BUYERS_READ_INTERVAL, BUYERS_TTL};
    let stack = Stack::start(always(6)).await;
    stack.open_sale("elsewhere", 1, 1).await;
    let (gateway2, addr2) = stack.start_second_gateway();
    let base2 = format!("http://{addr2}");
    // The other gateway sells the item (under a key), then its script
    // finds the sale sold out and announces it; this gateway never ran it.
    for (user, key, status) in [("first", Some("k-win"), 202), ("second", None, 410)] {
        let (_, c) = fetch_challenge(&stack, "elsewhere", user).await;
        let pow = solution(&c);
        let got = buy_at(&stack, &base2, "elsewhere", user, Some(&pow), key).await;
        assert_eq!(got.0, status, "{user}: {}", got.2);
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while buy(&stack, "elsewhere", "late", None, None).await.0 != 410 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the announce never flagged the sale here"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A keyed buy of a user who never reserved an item: the sale's buyers
    // are read here, and it is answered at once, no proof of work asked.
    let read_at = tokio::time::Instant::now();
    let late = buy(&stack, "elsewhere", "late", None, Some("k-1")).await;
    assert_sold_out("late", &late);
    // The winner's retry may replay the win: it pays its proof of work and
    // the script replays it.
    let retry = buy(&stack, "elsewhere", "first", None, Some("k-win")).await;
    assert_challenge_required("the winner's retry", &retry, "proof of work");
    let pow = solution(&retry.2);
    let (status, replayed, body) =
        buy(&stack, "elsewhere", "first", Some(&pow), Some("k-win")).await;
    assert!(matches!(status, 201 | 202) && replayed, "{status} {body}");
    // Past the buyers' TTL, the same proof (nothing left, the same stock
    // epoch) renews them, without reading them again.
    let hvals = stack.redis.command_calls("hvals").await;
    let ttl = BUYERS_TTL + Duration::from_millis(200);
    tokio::time::sleep(ttl).await;
    let later = buy(&stack, "elsewhere", "later", None, Some("k-2")).await;
    assert_sold_out("later", &later);
    assert_eq!(
        stack.redis.command_calls("hvals").await,
        hvals,
        "a renewal reads no buyers"
    );
    // Changes no event told of: an item left (what a return leaves) voids
    // them at the next renewal: a keyed non-buyer may buy, so it pays.
    let keys = flashgate_common::keys::SaleKeys::new("elsewhere");
    let mut conn = stack.redis_handle().await;
    let () = redis::cmd("SET")
        .arg(&keys.remaining)
        .arg(1)
        .query_async(&mut conn)
        .await
        .unwrap();
    tokio::time::sleep(ttl).await;
    let back = buy(&stack, "elsewhere", "later", None, Some("k-3")).await;
    assert_challenge_required("a keyed non-buyer, an item left", &back, "proof of work");
    // The item sold again (the epoch moved, none left): read anew once the
    // interval since the last read is over, the new buyer among them.
    let mut sold_again_unheard = async |rid: &str, user: &str| {
        let epoch: Option<u64> = redis::cmd("HGET")
            .arg(&keys.meta)
            .arg("epoch")
            .query_async(&mut conn)
            .await
            .unwrap();
        let () = redis::pipe()
            .atomic()
            .hset(&keys.meta, "epoch", epoch.unwrap_or(0) + 1)
            .ignore()
            .set(&keys.remaining, 0)
            .ignore()
            .hset(&keys.reservations, rid, user)
            .ignore()
            .query_async(&mut conn)
            .await
            .unwrap();
    };
    sold_again_unheard("r-unheard-1", "newcomer").await;
    tokio::time::sleep_until(read_at + BUYERS_READ_INTERVAL + Duration::from_millis(600)).await;
    let newcomer = buy(&stack, "elsewhere", "newcomer", None, Some("k-4")).await;
    assert_challenge_required("the new buyer's keyed buy", &newcomer, "proof of work");
    let latest = buy(&stack, "elsewhere", "latest", None, Some("k-5")).await;
    assert_sold_out("latest", &latest);
    // Sold again, unheard, while they are held: the renewal finds the
    // epoch moved, and the new buyer's keyed buy goes to the script.
    sold_again_unheard("r-unheard-2", "newcomer2").await;
    tokio::time::sleep(ttl).await;
    let newcomer2 = buy(&stack, "elsewhere", "newcomer2", None, Some("k-6")).await;
    assert_challenge_required(
        "the next new buyer's keyed buy",
        &newcomer2,
        "proof of work",
    );
    drop(gateway2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buy_with_a_bad_body_is_a_400_that_spends_neither_its_proof_of_work_nor_a_cluster_token()
{
    let stack = Stack::start(StackOptions {
        extra_toml:
            "[challenge]\nmode = \"always\"\ndifficulty_bits = 6\nttl_seconds = 60\n\n[limits.cluster_global]\nper_second = 1\nburst = 1\n"
                .into(),
        ..StackOptions::default()
    })
    .await;
    stack.open_sale("body", 10, 1).await;
    let (_, ahead) = fetch_challenge(&stack, "body", "bob").await;
    let pow = solution(&ahead);
    let sent = stack
        .http
        .post(stack.url("/flashgate/api/sales/body/buy"))
        .bearer_auth(token("bob"))
        .header("Flashgate-Pow", &pow)
        .header("Content-Type", "application/json")
        .body("[1, 2")
        .send()
        .await
        .unwrap();
    let status = sent.status().as_u16();
    let body: Value = sent.json().await.unwrap();
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("bad_request")),
        "{body}"
    );
    // The same solution, the cluster's one token: both still there.
    let (status, _, body) = buy(&stack, "body", "bob", Some(&pow), None).await;
    assert_eq!(status, 202, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adaptive_difficulty_rises_for_a_burst_and_stays_at_the_base_for_a_calm_user() {
    let stack = Stack::start(StackOptions {
        extra_toml: "[challenge]\nmode = \"adaptive\"\ndifficulty_bits = 4\nmax_difficulty_bits = 20\nuser_rate_per_minute = 6\n\
                     ip_rate_per_minute = 1000000\nsale_rate_per_second = 1000000\n"
            .into(),
        ..StackOptions::default()
    })
    .await;
    stack.open_sale("hot", 10, 1).await;

    let (_, calm) = fetch_challenge(&stack, "hot", "calm").await;
    assert_eq!(calm["difficulty_bits"], 4, "{calm}");
    let mut asked = Vec::new();
    for _ in 0..50 {
        let (_, _, body) = buy(&stack, "hot", "script", None, None).await;
        asked.push(body["difficulty_bits"].as_u64().unwrap());
    }
    assert_eq!(
        asked[0], 4,
        "the first request of a burst is calm: {asked:?}"
    );
    assert!(
        asked[49] >= 7,
        "50 requests at once are more than 2^3 times 6 a minute: {asked:?}"
    );
    assert!(
        asked.windows(2).all(|w| w[0] <= w[1]),
        "the difficulty never falls during the burst: {asked:?}"
    );
    let (_, calm) = fetch_challenge(&stack, "hot", "calm").await;
    assert_eq!(
        calm["difficulty_bits"], 4,
        "the burst costs only its own user: {calm}"
    );
    // The script's solution must meet the difficulty it was given.
    let (_, hard) = fetch_challenge(&stack, "hot", "script").await;
    let bits = hard["difficulty_bits"].as_u64().unwrap();
    assert!(bits >= 7);
    assert_eq!(
        buy(&stack, "hot", "script", Some(&solution(&hard)), None)
            .await
            .0,
        202
    );
    let text = stack.gateway_metrics_text().await;
    assert!(
        text.contains("flashgate_challenge_difficulty_count 53"),
        "2 + 50 + 1 challenges issued:\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_challenges_off_buys_ignore_the_header_and_nothing_is_issued() {
    let stack = Stack::start(StackOptions::default()).await;
    stack.open_sale("plain", 5, 1).await;
    let (status, body) = fetch_challenge(&stack, "plain", "frank").await;
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("not_found")),
        "{body}"
    );
    assert_eq!(
        buy(&stack, "plain", "frank", Some("anything at all"), None)
            .await
            .0,
        202
    );
    assert_eq!(buy(&stack, "plain", "gina", None, None).await.0, 202);
    assert_eq!(
        metric(&stack, "flashgate_challenges_issued_total").await,
        "0"
    );
    assert!(rejections(&stack).await.is_empty());
}
