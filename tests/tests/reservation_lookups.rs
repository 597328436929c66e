//! `GET /flashgate/api/reservations/{id}` is admitted like every other route of a
//! signed-in user: IP deny list, IP bucket, token, user deny list, user
//! bucket (the read class).

use flashgate_tests::{token, Stack, StackOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservation_lookups_pass_the_deny_lists_and_the_read_buckets() {
    let extra = "[limits]\ntrusted_proxies = [\"127.0.0.1/32\"]\n\
                 [limits.read]\nuser = { per_second = 1, burst = 3 }\n\
                 [deny]\nusers = [\"eve\"]\nips = [\"203.0.113.0/24\"]\n";
    let stack = Stack::start(StackOptions {
        extra_toml: extra.into(),
        ..StackOptions::default()
    })
    .await;
    stack.open_sale("look", 5, 1).await;
    let (status, body) = stack.buy("look", "alice", None).await;
    assert_eq!(status, 202, "{body}");
    let url = stack.url(&format!(
        "/flashgate/api/reservations/{}",
        body["reservation_id"].as_str().unwrap()
    ));
    let get = |user: &str, forwarded_for: Option<&str>| {
        let mut req = stack.http.get(&url).bearer_auth(token(user));
        if let Some(ip) = forwarded_for {
            req = req.header("X-Forwarded-For", ip);
        }
        async move {
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            (
                status,
                resp.json::<serde_json::Value>().await.unwrap_or_default(),
            )
        }
    };

    let (status, body) = get("alice", Some("203.0.113.9")).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("denied")),
        "a denied IP: {body}"
    );
    let (status, body) = get("eve", None).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("denied")),
        "a denied user: {body}"
    );

    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(get("alice", None).await.0);
    }
    assert_eq!(statuses[0], 200, "{statuses:?}");
    assert!(
        statuses.contains(&429),
        "hammering the lookup was never limited: {statuses:?}"
    );
}
