//! The opening draw against a real redis-server, without Pingora: who may
//! enter, how a re-sent call and a replay differ, what a held buy is
//! answered when Redis stalls, what the draw's sold out flags, and that a
//! draw's keys expire even when it never finishes.

use std::time::Duration;

use flashgate_common::keys::SaleKeys;
use flashgate_common::reservation::reservation_id;

use super::deduct::{BuyAttempt, Decision, DeductOutcome};
use super::draw::Entrant;
use super::tests::{fixture, Fixture};
use super::*;
use crate::rejection::Rejection;

impl Fixture {
    /// One deduct call as the gateway sends it, with reservation id `rid`
    /// and call nonce `nonce`.
    async fn deduct_call(
        &self,
        sale_id: &str,
        user: &str,
        key: &str,
        nonce: &str,
        rid: &str,
    ) -> Decision {
        let attempt = BuyAttempt {
            sale_id,
            user_id: user,
            idempotency_key: key,
            reservation_id: rid,
            call_nonce: nonce,
            idempotency_ttl_seconds: 600,
            draw_window_ms: 0,
            buckets: 1,
            dry_is_final: false,
        };
        self.service.deducts.deduct(&attempt).await.unwrap()
    }

    /// A fresh call (new reservation id and nonce).
    async fn deduct_once(&self, sale_id: &str, user: &str, key: &str) -> Decision {
        let nonce = format!("{:016x}", rand::random::<u64>());
        self.deduct_call(
            sale_id,
            user,
            key,
            &nonce,
            &reservation_id(sale_id, rand::random()),
        )
        .await
    }

    async fn entries(&self, sale_id: &str) -> u64 {
        redis::cmd("HLEN")
            .arg(&SaleKeys::new(sale_id).draw.entries)
            .query_async(&mut self.redis.conn().await)
            .await
            .unwrap()
    }
}

fn entered(d: &Decision) -> Option<(u64, u64)> {
    match d.outcome {
        DeductOutcome::Entered {
            entry,
            closes_in_ms,
        } => Some((entry, closes_in_ms)),
        _ => None,
    }
}

#[tokio::test]
async fn a_user_holds_no_more_draw_entries_than_the_per_user_limit() {
    let f = fixture(&[]).await;
    f.draw_sale("s", 10, 2, Duration::from_secs(60)).await;
    for key in ["k1", "k2"] {
        let d = f.deduct_once("s", "bot", key).await;
        assert!(entered(&d).is_some() && !d.replayed, "{key}: {d:?}");
    }
    // A third key would only make an early decision likelier: refused at once.
    let third = f.deduct_once("s", "bot", "k3").await;
    assert_eq!(
        (third.outcome, third.replayed),
        (DeductOutcome::LimitReached, false)
    );
    let again = f.deduct_once("s", "bot", "k3").await;
    assert_eq!(
        (again.outcome, again.replayed),
        (DeductOutcome::LimitReached, true),
        "remembered under its key"
    );
    let keyless = f.deduct_once("s", "bot", "").await;
    assert_eq!(
        keyless.outcome,
        DeductOutcome::LimitReached,
        "without a key too"
    );
    // A replay of a held entry joins it and takes no place of its own.
    let joined = f.deduct_once("s", "bot", "k1").await;
    assert!(entered(&joined).is_some() && joined.replayed, "{joined:?}");
    let other = f.deduct_once("s", "other", "k1").await;
    assert!(
        entered(&other).is_some() && !other.replayed,
        "another user is not limited by the bot: {other:?}"
    );
    assert_eq!(f.entries("s").await, 3);
    let remaining: i64 = redis::cmd("GET")
        .arg(&SaleKeys::new("s").remaining)
        .query_async(&mut f.redis.conn().await)
        .await
        .unwrap();
    assert_eq!(remaining, 10, "nothing taken while the window is open");
}

#[tokio::test]
async fn a_resent_call_in_the_draw_is_answered_as_the_original_not_as_a_replay() {
    let f = fixture(&[]).await;
    f.draw_sale("s", 2, 1, Duration::from_millis(400)).await;
    // No Idempotency-Key: the cluster client re-sends the very call (same
    // nonce, same reservation id) when its connection dropped.
    let rid = reservation_id("s", 1);
    let first = f.deduct_call("s", "a", "", "n1", &rid).await;
    let resent = f.deduct_call("s", "a", "", "n1", &rid).await;
    let (entry, _) = entered(&first).expect("entered");
    assert_eq!(
        entered(&resent).map(|(e, _)| e),
        Some(entry),
        "the same entry"
    );
    assert!(
        !first.replayed && !resent.replayed,
        "a re-sent call is not a replay: {resent:?}"
    );
    assert_eq!(f.entries("s").await, 1);
    // A second key of another user: its replay joins as a replay.
    assert!(!f.deduct_once("s", "b", "kb").await.replayed);
    let replay = f.deduct_once("s", "b", "kb").await;
    assert!(entered(&replay).is_some() && replay.replayed, "{replay:?}");

    // The held call is answered as the original: its reservation, with
    // its time, counted once as a winner.
    let (_, closes_in_ms) = entered(&resent).unwrap();
    let draws = &f.service.draws;
    let entrant = Entrant {
        user: "a",
        rid: Some(&rid),
    };
    let decided = draws
        .outcome(
            &f.service.redis,
            "s",
            entry,
            Duration::from_millis(closes_in_ms),
            resent.replayed,
            entrant,
        )
        .await
        .unwrap();
    let DeductOutcome::Won {
        reservation_id,
        reserved_at_ms: Some(at),
    } = decided.outcome
    else {
        panic!("{decided:?}")
    };
    assert_eq!(reservation_id, rid);
    assert!(!decided.replayed);
    assert_eq!(draws.metrics.winners.get(), 1);
    // Sent once more after the draw: still that win, with the same time.
    let late = f.deduct_call("s", "a", "", "n1", &rid).await;
    assert_eq!(
        (late.outcome, late.replayed),
        (
            DeductOutcome::Won {
                reservation_id: rid.clone(),
                reserved_at_ms: Some(at)
            },
            false
        )
    );
    let stream: u64 = redis::cmd("XLEN")
        .arg(&SaleKeys::new("s").stream)
        .query_async(&mut f.redis.conn().await)
        .await
        .unwrap();
    assert_eq!(stream, 2, "one reservation per entrant");
}

#[tokio::test]
async fn entrants_held_while_redis_stalls_still_get_their_outcome() {
    let f = fixture(&[]).await;
    f.draw_sale("s", 2, 1, Duration::from_millis(1000)).await;
    let stall = async {
        // Once all three are held, Redis stops answering until well past
        // the window's close (the fixture's calls time out after 500 ms,
        // the breaker opens), and comes back within `settle_ms` (5 s).
        for _ in 0..400 {
            if f.entries("s").await == 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(
            f.entries("s").await,
            3,
            "the buys entered within the window"
        );
        f.redis.proc.signal("STOP");
        tokio::time::sleep(Duration::from_millis(2500)).await;
        f.redis.proc.signal("CONT");
    };
    let (a, b, c, ()) = tokio::join!(
        f.buy("s", "a", "ka"),
        f.buy("s", "b", ""),
        f.buy("s", "c", "kc"),
        stall
    );
    let answers = [a, b, c];
    let won = answers
        .iter()
        .filter(|o| matches!(o, BuyOutcome::Won { .. }))
        .count();
    let sold_out = answers
        .iter()
        .filter(|o| **o == BuyOutcome::Refused(Rejection::SoldOut))
        .count();
    assert_eq!(
        (won, sold_out),
        (2, 1),
        "every entrant got its final answer: {answers:?}"
    );
}

#[tokio::test]
async fn a_draw_that_sells_out_flags_the_sale_so_the_next_buy_costs_no_redis_call() {
    let f = fixture(&[]).await;
    f.draw_sale("s", 1, 1, Duration::from_millis(300)).await;
    let (a, b, c) = tokio::join!(
        f.buy("s", "a", ""),
        f.buy("s", "b", "kb"),
        f.buy("s", "c", "")
    );
    let answers = [a, b, c];
    assert_eq!(
        answers
            .iter()
            .filter(|o| matches!(o, BuyOutcome::Won { .. }))
            .count(),
        1,
        "{answers:?}"
    );
    assert!(
        f.service.sales.is_sold_out("s"),
        "the draw's sold out flags the sale"
    );
    assert_eq!(
        f.redis.command_calls("publish").await,
        1,
        "announced to the other gateways, once"
    );

    let monitor = f.redis.monitor().await;
    assert_eq!(
        f.buy("s", "d", "").await,
        BuyOutcome::Refused(Rejection::SoldOut)
    );
    assert_eq!(
        monitor.commands().await,
        Vec::<String>::new(),
        "answered without Redis"
    );
    assert_eq!(f.local_decisions("sold_out"), 1);
}

#[tokio::test]
async fn a_joined_entrys_sold_out_is_a_replay_and_flags_nothing() {
    let f = fixture(&[]).await;
    f.draw_sale("s", 1, 1, Duration::from_millis(300)).await;
    let held = f.deduct_once("s", "b", "kb").await;
    let (_, closes_in_ms) = entered(&held).expect("entered");
    // The item goes elsewhere before the draw (as if sold by a gateway
    // before the window): the entrant will be told sold out.
    let () = redis::cmd("SET")
        .arg(&SaleKeys::new("s").remaining)
        .arg(0)
        .query_async(&mut f.redis.conn().await)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(closes_in_ms + 20)).await;
    // The retry joins the undecided entry and is held for its outcome.
    assert_eq!(
        f.buy("s", "b", "kb").await,
        BuyOutcome::Refused(Rejection::SoldOut)
    );
    assert!(
        !f.service.sales.is_sold_out("s"),
        "a replayed sold out tells an earlier attempt's result"
    );
    assert_eq!(f.redis.command_calls("publish").await, 0);
}

#[tokio::test]
async fn a_draw_never_finished_leaves_no_key_without_expiry() {
    let f = fixture(&[]).await;
    f.draw_sale("s", 5, 1, Duration::from_millis(200)).await;
    let mut closes_in_ms = 0;
    for user in ["a", "b", "c"] {
        closes_in_ms = entered(&f.deduct_once("s", user, "k").await)
            .expect("entered")
            .1;
    }
    tokio::time::sleep(Duration::from_millis(closes_in_ms + 20)).await;
    // One call deciding one entrant, then nobody runs the draw again.
    let keys = SaleKeys::new("s");
    let d = &keys.draw;
    let mut conn = f.redis.conn().await;
    let reply: Vec<String> = crate::buy::draw::draw_run_call(
        &flashgate_common::scripts::DRAW_RUN,
        &keys,
        "s",
        "00ff",
        1,
        600,
    )
    .invoke_async(&mut conn)
    .await
    .unwrap();
    assert_eq!(reply, ["pending", "1"]);
    for key in [&d.state, &d.entries, &d.index, &d.outcomes, &d.order] {
        let ttl: i64 = redis::cmd("TTL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(ttl > 0, "{key}: TTL {ttl}");
    }
    let ttl: i64 = redis::cmd("TTL")
        .arg(&d.perm)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_ne!(ttl, -1, "{}: kept for ever", d.perm);
}

#[tokio::test]
async fn items_already_bought_count_against_the_draw_entries_a_user_may_hold() {
    let f = fixture(&[]).await;
    // A sale without a draw window (it closed as the sale opened): bought at once.
    f.draw_sale("s", 10, 2, Duration::ZERO).await;
    let bought = f.deduct_once("s", "u", "k1").await;
    assert!(
        matches!(bought.outcome, DeductOutcome::Won { .. }),
        "{bought:?}"
    );
    // An operator opens a draw mid-sale: the buyer of 1 of 2 may hold one entry.
    let keys = SaleKeys::new("s");
    let () = redis::cmd("HSET")
        .arg(&keys.meta)
        .arg("draw_window_ms")
        .arg(86_400_000)
        .query_async(&mut f.redis.conn().await)
        .await
        .unwrap();
    let entered_once = f.deduct_once("s", "u", "k2").await;
    assert!(entered(&entered_once).is_some(), "{entered_once:?}");
    let second = f.deduct_once("s", "u", "k3").await;
    assert_eq!(
        (second.outcome, second.replayed),
        (DeductOutcome::LimitReached, false),
        "1 bought + 1 entry = the limit"
    );
    assert_eq!(f.entries("s").await, 1);
}

#[tokio::test]
async fn calls_without_key_or_nonce_are_separate_entries_not_one_shared_entry() {
    let f = fixture(&[]).await;
    f.draw_sale("s", 10, 2, Duration::from_secs(60)).await;
    let first = f
        .deduct_call("s", "a", "", "", &reservation_id("s", 1))
        .await;
    let second = f
        .deduct_call("s", "a", "", "", &reservation_id("s", 2))
        .await;
    let (e1, e2) = (
        entered(&first).expect("entered").0,
        entered(&second).expect("entered").0,
    );
    assert_ne!(e1, e2, "{first:?} {second:?}");
    assert!(!first.replayed && !second.replayed);
    assert_eq!(f.entries("s").await, 2);
    // Still capped at the per-user limit.
    let third = f
        .deduct_call("s", "a", "", "", &reservation_id("s", 3))
        .await;
    assert_eq!(third.outcome, DeductOutcome::LimitReached);
    let index: Vec<String> = redis::cmd("HKEYS")
        .arg(&SaleKeys::new("s").draw.index)
        .query_async(&mut f.redis.conn().await)
        .await
        .unwrap();
    assert_eq!(
        index,
        ["c:1:a"],
        "no entrant name for a call without key or nonce"
    );
}

#[tokio::test]
async fn a_draw_call_failing_mid_loop_leaves_its_shuffle_positions_expiring() {
    let f = fixture(&[]).await;
    f.draw_sale("s", 1, 1, Duration::from_millis(200)).await;
    let mut closes_in_ms = 0;
    for user in ["a", "b", "c"] {
        closes_in_ms = entered(&f.deduct_once("s", user, "k").await)
            .expect("entered")
            .1;
    }
    tokio::time::sleep(Duration::from_millis(closes_in_ms + 20)).await;
    let keys = SaleKeys::new("s");
    let d = &keys.draw;
    let mut conn = f.redis.conn().await;
    // The first entrant decided wins the one item; the second, sold out,
    // is remembered in its user's misses hash, which is a string here:
    // WRONGTYPE, after the call wrote the shuffle's positions.
    for user in ["a", "b", "c"] {
        let () = redis::cmd("SET")
            .arg(keys.idempotency_misses(user))
            .arg("x")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    // Seed "02ff" swaps positions 1 and 2 first (sha1("02ff:1")), so the
    // shuffle's positions hash is written before the failure.
    let reply: Result<Vec<String>, _> = crate::buy::draw::draw_run_call(
        &flashgate_common::scripts::DRAW_RUN,
        &keys,
        "s",
        "02ff",
        500,
        600,
    )
    .invoke_async(&mut conn)
    .await;
    assert!(reply.is_err(), "{reply:?}");
    let cursor: String = redis::cmd("HGET")
        .arg(&d.state)
        .arg("cursor")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(cursor, "1", "one entrant decided before the failure");
    let perm: u64 = redis::cmd("HLEN")
        .arg(&d.perm)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(perm > 0, "the shuffle's positions were written");
    let ttl: i64 = redis::cmd("TTL")
        .arg(&d.perm)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(ttl > 0, "{}: TTL {ttl}", d.perm);
}

#[tokio::test]
async fn a_draw_sold_out_decided_before_the_sale_was_cleared_does_not_flag_it_again() {
    let f = fixture(&[]).await;
    f.draw_sale("s", 1, 1, Duration::from_millis(300)).await;
    let clears = f.service.sales.clears("s");
    let held = f.deduct_once("s", "b", "kb").await;
    let (entry, closes_in_ms) = entered(&held).expect("entered");
    // The item goes elsewhere: the draw decides the entrant sold out.
    let () = redis::cmd("SET")
        .arg(&SaleKeys::new("s").remaining)
        .arg(0)
        .query_async(&mut f.redis.conn().await)
        .await
        .unwrap();
    let entrant = Entrant {
        user: "b",
        rid: None,
    };
    let draws = &f.service.draws;
    let decided = draws
        .outcome(
            &f.service.redis,
            "s",
            entry,
            Duration::from_millis(closes_in_ms),
            false,
            entrant,
        )
        .await
        .unwrap();
    assert!(decided.found_sold_out(), "{decided:?}");
    // Before it is read, stock comes back (an operator's restock, a
    // returned item): the sale's `Changed` event clears it.
    f.service.sales.forget("s", None).await;
    f.service.draw_found_sold_out("s", &decided, clears).await;
    assert!(
        !f.service.sales.is_sold_out("s"),
        "a sold out decided before the clear flagged the sale again"
    );
    assert_eq!(
        f.redis.command_calls("publish").await,
        0,
        "nor announced it"
    );
    // The same outcome with no clear since its entry flags it.
    f.service
        .draw_found_sold_out("s", &decided, f.service.sales.clears("s"))
        .await;
    assert!(f.service.sales.is_sold_out("s"));
    assert_eq!(f.redis.command_calls("publish").await, 1);
}

#[tokio::test]
async fn a_keyed_retry_in_a_sale_flagged_mid_draw_gets_its_entrys_outcome_not_the_flag() {
    let f = fixture(&[]).await;
    f.draw_sale("s", 1, 1, Duration::from_millis(300)).await;
    for (user, key) in [("u", "k"), ("x", "kx")] {
        let held = f.deduct_once("s", user, key).await;
        assert!(entered(&held).is_some(), "{user}: {held:?}");
    }
    // The draw decides both entries (its wins before its sold out), and
    // its sold out flags the sale, as another gateway announces it.
    f.service.draws.settle(&f.service.redis, "s").await.unwrap();
    f.service.sales.flag_sold_out("s", None, None);
    // Each key gets its entry's outcome: the winner's retry replays its
    // win (not the flag's sold out), the other's is the draw's sold out.
    let answers = [f.buy("s", "u", "k").await, f.buy("s", "x", "kx").await];
    let won = answers
        .iter()
        .filter(|a| matches!(a, BuyOutcome::Replayed { .. }))
        .count();
    let sold_out = answers
        .iter()
        .filter(|a| **a == BuyOutcome::Refused(Rejection::SoldOut))
        .count();
    assert_eq!((won, sold_out), (1, 1), "{answers:?}");
    // The winner's fresh key goes to the deduct, which enforces the limit.
    let again = f.buy("s", "u", "k2").await;
    let again_x = f.buy("s", "x", "k2").await;
    assert!(
        !matches!(again, BuyOutcome::Won { .. } | BuyOutcome::Replayed { .. }),
        "{again:?}"
    );
    assert!(
        !matches!(
            again_x,
            BuyOutcome::Won { .. } | BuyOutcome::Replayed { .. }
        ),
        "{again_x:?}"
    );

    // A user who never won is answered sold out by the deduct, which
    // remembers it under the key; the sale's buyers are then read, and the
    // next such user is answered here, with no Redis call.
    assert_eq!(
        f.buy("s", "v", "kv").await,
        BuyOutcome::Refused(Rejection::SoldOut)
    );
    let monitor = f.redis.monitor().await;
    assert_eq!(
        f.buy("s", "w", "kw").await,
        BuyOutcome::Refused(Rejection::SoldOut)
    );
    assert_eq!(monitor.commands().await, Vec::<String>::new());
}

#[tokio::test]
async fn a_winners_unknown_key_in_a_sold_out_sale_without_a_draw_gets_the_deducts_own_answer() {
    let f = fixture(&[]).await;
    f.open_sale("s", 1).await;
    assert!(matches!(
        f.buy("s", "winner", "k").await,
        BuyOutcome::Won { .. }
    ));
    assert_eq!(
        f.buy("s", "late", "").await,
        BuyOutcome::Refused(Rejection::SoldOut)
    );
    assert!(f.service.sales.is_sold_out("s"));
    // The deduct decides it (never a second item): what it answers a
    // fresh key of this user, remembered under that key.
    let expected = match f.deduct_once("s", "winner", "direct").await.outcome {
        DeductOutcome::SoldOut => Rejection::SoldOut,
        DeductOutcome::LimitReached => Rejection::LimitReached,
        other => panic!("a sold-out sale's deduct answered {other:?}"),
    };
    assert_eq!(
        f.buy("s", "winner", "k2").await,
        BuyOutcome::Refused(expected.clone())
    );
    assert_eq!(
        f.buy("s", "winner", "k2").await,
        BuyOutcome::Refused(expected),
        "the key keeps its answer"
    );
    let remaining: i64 = redis::cmd("GET")
        .arg(&SaleKeys::new("s").remaining)
        .query_async(&mut f.redis.conn().await)
        .await
        .unwrap();
    assert_eq!(remaining, 0, "nothing taken beyond the stock");
}
