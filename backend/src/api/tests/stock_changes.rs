//! The order of a one-bucket sale's stock change against its commit, a
//! change refused on a fenced sale, and what reconciliation and a failed
//! commit do with a stock Redis holds that the database does not.

use flashgate_common::sale::SaleSpec;

use super::*;

/// The stock and remaining Redis sells one-bucket sale `id` from.
async fn books(f: &Fixture, id: &str) -> (i64, i64) {
    let mut conn = f.redis.conn().await;
    let keys = SaleKeys::new(id);
    (
        conn.hget(&keys.meta, "stock").await.unwrap(),
        conn.get(&keys.remaining).await.unwrap(),
    )
}

/// A PUT of `body` to `uri`: status, `Retry-After` and JSON body.
async fn put_with_headers(
    f: &Fixture,
    uri: &str,
    body: &str,
) -> (StatusCode, Option<String>, Value) {
    let request = Request::builder()
        .method("PUT")
        .uri(uri)
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-type", "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap();
    let response = admin_router(f.state.clone())
        .oneshot(request)
        .await
        .unwrap();
    let status = response.status();
    let retry = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, retry, serde_json::from_slice(&bytes).unwrap())
}

#[tokio::test]
async fn a_stock_change_on_a_fenced_sale_is_refused_with_retry_after_and_changes_nothing() {
    let f = fixture().await;
    let id = unique("s");
    let uri = format!("/admin/sales/{id}");
    assert_eq!(
        admin(&f, "PUT", &uri, Some(&sale_body(10))).await.0,
        StatusCode::CREATED
    );
    // Two items sold, then the Redis failed over: the sale is fenced
    // until its re-sync (its count may lack the last deducts).
    let mut conn = f.redis.conn().await;
    let keys = SaleKeys::new(&id);
    let () = conn.decr(&keys.remaining, 2).await.unwrap();
    let () = conn
        .set(&keys.synced, "a-redis-before-the-failover")
        .await
        .unwrap();

    for stock in [3, 20] {
        let (status, retry, body) = put_with_headers(&f, &uri, &sale_body(stock)).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, Some("sale_fenced")),
            "stock {stock}: {body}"
        );
        assert!(
            retry.is_some_and(|r| r.parse::<u32>().is_ok_and(|s| s > 0)),
            "stock {stock}: Retry-After"
        );
        assert_eq!(
            f.state.store.sales().get(&id).await.unwrap().unwrap().stock,
            10,
            "stock {stock}: the database kept its stock"
        );
        assert_eq!(
            books(&f, &id).await,
            (10, 8),
            "stock {stock}: redis kept its stock and remaining"
        );
    }
    // The stock unchanged (a rename) is no stock change: accepted.
    let (status, view) = admin(
        &f,
        "PUT",
        &uri,
        Some(&sale_body(10).replace("Sneaker", "Boot")),
    )
    .await;
    assert_eq!(
        (status, view["name"].as_str()),
        (StatusCode::OK, Some("Boot")),
        "{view}"
    );
    assert_eq!(books(&f, &id).await, (10, 8));
}

#[tokio::test]
async fn a_refused_put_back_after_a_failed_commit_is_logged_counted_and_reported_as_drift() {
    let f = fixture().await;
    let id = unique("s");
    let uri = format!("/admin/sales/{id}");
    assert_eq!(
        admin(&f, "PUT", &uri, Some(&sale_body(5))).await.0,
        StatusCode::CREATED
    );
    let old = f.state.store.sales().get(&id).await.unwrap().unwrap();
    // Redis sells from 8 while the database holds 5 (a surplus left by a
    // change that died), and 7 items are sold: 5 cannot be put back.
    let raised = SaleSpec {
        stock: 8,
        ..old.clone()
    };
    crate::sales::apply(&mut f.state.redis.clone(), &f.state.store, &raised)
        .await
        .unwrap();
    let () = f
        .redis
        .conn()
        .await
        .decr(SaleKeys::new(&id).remaining, 7)
        .await
        .unwrap();
    let refused = &f.state.metrics.stock_reverts_refused;
    super::admin::after_failed_commit(
        &mut f.state.redis.clone(),
        &f.state.store,
        &raised,
        Some(&old),
        None,
        refused,
    )
    .await;
    assert_eq!(refused.get(), 1, "the refusal is counted");
    assert!(scrape(&f)
        .await
        .contains("flashgate_backend_stock_reverts_refused_total 1"));
    assert_eq!(books(&f, &id).await, (8, 1), "nothing moved");

    // Reconciliation compares Redis's stock with the database's row: the
    // surplus is sold, so it stays, reported as drift.
    let (status, report) = admin(&f, "POST", &format!("{uri}/reconcile"), None).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(
        (report["bases_moved"].as_i64(), report["bases_off"].as_i64()),
        (Some(0), Some(3)),
        "{report}"
    );
    assert_eq!(
        report["drift"].as_i64(),
        Some(7 + 3),
        "7 sold without orders, 3 items more than the database's stock: {report}"
    );
}

#[tokio::test]
async fn reconciliation_moves_a_one_bucket_sales_stock_in_redis_to_the_database_stock() {
    let f = fixture().await;
    let id = unique("s");
    let uri = format!("/admin/sales/{id}");
    assert_eq!(
        admin(&f, "PUT", &uri, Some(&sale_body(8))).await.0,
        StatusCode::CREATED
    );
    let saved = f.state.store.sales().get(&id).await.unwrap().unwrap();
    // Too many (a change that reached Redis and died before its commit):
    // the unsold surplus is taken.
    crate::sales::apply(
        &mut f.state.redis.clone(),
        &f.state.store,
        &SaleSpec {
            stock: 11,
            ..saved.clone()
        },
    )
    .await
    .unwrap();
    let (status, report) = admin(&f, "POST", &format!("{uri}/reconcile"), None).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(
        (
            report["bases_moved"].as_i64(),
            report["bases_off"].as_i64(),
            report["drift"].as_i64()
        ),
        (Some(-3), Some(0), Some(0)),
        "{report}"
    );
    assert_eq!(books(&f, &id).await, (8, 8));
    // Too few (a raise committed, the backend dead before Redis got it):
    // the missing items are added.
    crate::sales::apply(
        &mut f.state.redis.clone(),
        &f.state.store,
        &SaleSpec { stock: 5, ..saved },
    )
    .await
    .unwrap();
    let (status, report) = admin(&f, "POST", &format!("{uri}/reconcile"), None).await;
    assert_eq!(
        (
            status,
            report["bases_moved"].as_i64(),
            report["bases_off"].as_i64()
        ),
        (StatusCode::OK, Some(3), Some(0)),
        "{report}"
    );
    assert_eq!(books(&f, &id).await, (8, 8));
}
