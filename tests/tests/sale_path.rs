//! The sale path end to end: real redis-server, backend, gateway and shop
//! over loopback. Zero oversell and no lost winner under concurrency.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use flashgate_tests::{buy_all, random_user, Attempt, Stack, StackOptions};
use rand::seq::SliceRandom;

/// A buy answered 503 (Redis slower than its timeout on a loaded machine)
/// is sent again with its key, as a client does, until it gets a final
/// answer: the books below must hold over those retries too.
async fn retry_unavailable(
    gateway: std::net::SocketAddr,
    sale: &str,
    outcomes: Vec<flashgate_tests::Outcome>,
) -> Vec<flashgate_tests::Outcome> {
    let mut settled = Vec::with_capacity(outcomes.len());
    for mut outcome in outcomes {
        for _ in 0..20 {
            if outcome.status != 503 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            outcome = buy_all(gateway, sale, vec![outcome.attempt.clone()], 1)
                .await
                .remove(0);
        }
        settled.push(outcome);
    }
    settled
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_items_among_five_thousand_buyers_make_exactly_hundred_orders() {
    let stack = Stack::start(StackOptions::default()).await;
    stack.open_sale("drop100", 100, 1).await;

    let users: Vec<String> = (0..5000).map(|_| random_user()).collect();
    let mut attempts: Vec<Attempt> = users
        .iter()
        .map(|u| Attempt {
            user: u.clone(),
            idempotency_key: Some(format!("k-{u}")),
        })
        .collect();
    // 1,000 retries repeat an Idempotency-Key, concurrently with the first tries.
    attempts.extend(attempts[..1000].to_vec());
    attempts.shuffle(&mut rand::rng());
    let first = retry_unavailable(
        stack.gateway_addr,
        "drop100",
        buy_all(stack.gateway_addr, "drop100", attempts, 128).await,
    )
    .await;
    // 1,000 second attempts, with a new key, by users who already tried.
    let again: Vec<Attempt> = users[2000..3000]
        .iter()
        .map(|u| Attempt {
            user: u.clone(),
            idempotency_key: Some(format!("again-{u}")),
        })
        .collect();
    let second = retry_unavailable(
        stack.gateway_addr,
        "drop100",
        buy_all(stack.gateway_addr, "drop100", again, 128).await,
    )
    .await;

    let unexpected: Vec<_> = first
        .iter()
        .chain(&second)
        .filter(|o| ![201, 202, 409, 410].contains(&o.status))
        .collect();
    assert!(
        unexpected.is_empty(),
        "unexpected outcomes: {:?}",
        &unexpected[..unexpected.len().min(3)]
    );

    let winners: HashSet<&str> = first
        .iter()
        .filter(|o| o.won())
        .filter_map(|o| o.reservation_id())
        .collect();
    assert_eq!(winners.len(), 100, "distinct reservations handed out");
    let winning_users: HashSet<&str> = first
        .iter()
        .filter(|o| o.won())
        .map(|o| o.attempt.user.as_str())
        .collect();
    assert_eq!(winning_users.len(), 100, "one reservation per winning user");
    assert!(
        second.iter().all(|o| !o.won()),
        "a second attempt never wins with per_user_limit = 1"
    );

    // A repeated Idempotency-Key gets the first outcome, never a second deduction.
    let mut by_key: HashMap<&str, Vec<&flashgate_tests::Outcome>> = HashMap::new();
    for o in &first {
        by_key
            .entry(o.attempt.idempotency_key.as_deref().unwrap())
            .or_default()
            .push(o);
    }
    let mut replays = 0;
    for outcomes in by_key.values().filter(|v| v.len() == 2) {
        replays += 1;
        let (a, b) = (outcomes[0], outcomes[1]);
        assert_eq!(a.won(), b.won(), "same key, same outcome: {a:?} vs {b:?}");
        assert_eq!(a.reservation_id(), b.reservation_id());
        if !a.won() {
            assert_eq!(a.status, b.status);
        }
    }
    assert_eq!(replays, 1000);

    let (orders, users_with_orders, most) = stack
        .wait_orders("drop100", 100, Duration::from_secs(30))
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (orders_later, _, _) = stack.db_orders("drop100").await;
    assert_eq!(
        (orders, orders_later, users_with_orders, most),
        (100, 100, 100, 1)
    );
    assert_eq!(stack.remaining("drop100").await, 0);
    assert_eq!(stack.stream_len("drop100").await, 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_user_limit_of_three_caps_every_buyer_and_sells_exactly_the_stock() {
    let stack = Stack::start(StackOptions::default()).await;
    stack.open_sale("limit3", 300, 3).await;
    let users: Vec<String> = (0..200).map(|_| random_user()).collect();
    let mut attempts: Vec<Attempt> = users
        .iter()
        .flat_map(|u| {
            (0..6).map(move |_| Attempt {
                user: u.clone(),
                idempotency_key: None,
            })
        })
        .collect();
    attempts.shuffle(&mut rand::rng());
    let outcomes = buy_all(stack.gateway_addr, "limit3", attempts, 128).await;

    let mut per_user: HashMap<&str, usize> = HashMap::new();
    for o in outcomes.iter().filter(|o| o.won()) {
        *per_user.entry(&o.attempt.user).or_default() += 1;
    }
    assert!(per_user.values().all(|&n| n <= 3), "a user won more than 3");
    assert_eq!(per_user.values().sum::<usize>(), 300);
    assert!(outcomes
        .iter()
        .all(|o| [201, 202, 409, 410].contains(&o.status)));

    let (orders, _, most) = stack
        .wait_orders("limit3", 300, Duration::from_secs(30))
        .await;
    assert_eq!((orders, most.min(3)), (300, most));
    assert!(most <= 3);
    assert_eq!(stack.remaining("limit3").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarting_gateway_and_backend_mid_sale_changes_nothing_sold_and_loses_nothing() {
    let mut stack = Stack::start(StackOptions::default()).await;
    stack.open_sale("restart", 200, 1).await;
    let before = stack.admin_sale("restart").await;

    let first_users: Vec<String> = (0..120).map(|_| random_user()).collect();
    let first = buy_all(
        stack.gateway_addr,
        "restart",
        first_users
            .iter()
            .map(|u| Attempt {
                user: u.clone(),
                idempotency_key: None,
            })
            .collect(),
        64,
    )
    .await;
    let first_winners: HashSet<String> = first
        .iter()
        .filter(|o| o.won())
        .filter_map(|o| o.reservation_id().map(str::to_owned))
        .collect();
    assert_eq!(first_winners.len(), 120);

    stack.kill_gateway();
    stack.kill_backend();
    stack.start_backend();
    stack.start_gateway();

    let after = stack.admin_sale("restart").await;
    assert_eq!(
        after["starts_at"], before["starts_at"],
        "restart moved the sale window"
    );
    assert_eq!(after["stock"], 200);
    assert_eq!(
        stack.remaining("restart").await,
        80,
        "restart reset the stock"
    );

    // The first buyers are still known: a second try hits their limit.
    let again = stack.buy("restart", &first_users[0], None).await;
    assert_eq!(again.0, 409, "{:?}", again.1);
    let second = buy_all(
        stack.gateway_addr,
        "restart",
        (0..300)
            .map(|_| Attempt {
                user: random_user(),
                idempotency_key: None,
            })
            .collect(),
        64,
    )
    .await;
    assert_eq!(second.iter().filter(|o| o.won()).count(), 80);

    let (orders, users, most) = stack
        .wait_orders("restart", 200, Duration::from_secs(30))
        .await;
    assert_eq!((orders, users, most), (200, 200, 1));
    assert_eq!(stack.remaining("restart").await, 0);
}
