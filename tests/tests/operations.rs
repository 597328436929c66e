//! Operating Flashgate: config validation at start and by `check`, live
//! reload of limits, and the deploy files' own validators.

use std::process::Command;
use std::time::{Duration, Instant};

use flashgate_tests::{bin, token, Stack, StackOptions, TempDir, JWT_SECRET};

fn workspace_file(rel: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel)
}

#[test]
fn check_accepts_the_shipped_config() {
    for file in [
        "config/flashgate.toml",
        "deploy/compose/flashgate.toml",
        "deploy/image/flashgate.toml",
    ] {
        let out = Command::new(bin("flashgate"))
            .arg("--config")
            .arg(workspace_file(file))
            .arg("check")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{file}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("ok"));
    }
}

#[test]
fn a_bad_config_exits_non_zero_naming_the_key() {
    let dir = TempDir::new("badcfg");
    let cases = [
        ("[gateway]\nthreads = 2\nthredas = 4\n", "thredas"),
        (
            "[limits.buy]\nuser = { per_second = 0, burst = 1 }\n",
            "limits.buy.user",
        ),
        ("[redis]\nurl = \"http://nope\"\n", "redis.url"),
        // Values that would fail only later: a Redis SET EX after the buy
        // ran, the limiter cache at start or reload.
        (
            "[gateway]\nidempotency_ttl_seconds = 9999999999\n",
            "gateway.idempotency_ttl_seconds",
        ),
        (
            "[limits]\nidle_seconds = 99999999999\n",
            "limits.idle_seconds",
        ),
    ];
    for (text, key) in cases {
        let path = dir.0.join("bad.toml");
        std::fs::write(&path, text).unwrap();
        for (binary, args) in [
            ("flashgate", vec!["check"]),
            ("flashgate", vec!["serve"]),
            ("flashgate-backend", vec![]),
        ] {
            let out = Command::new(bin(binary))
                .arg("--config")
                .arg(&path)
                .args(&args)
                .env("FLASHGATE_JWT_SECRET", flashgate_tests::JWT_SECRET)
                .env("FLASHGATE_ADMIN_TOKEN", flashgate_tests::ADMIN_TOKEN)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success(),
                "{binary} {args:?} accepted a bad config: {text}"
            );
            assert!(
                stderr.contains(key),
                "{binary}: `{key}` not named in: {stderr}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_changes_a_limit_in_a_running_gateway() {
    let stack = Stack::start(StackOptions::default()).await;
    stack.open_sale("reload", 1000, 1000).await;
    let steady = token("steady");
    let buy = || flashgate_tests::buy(&stack.http, stack.gateway_addr, "reload", &steady, None);
    for _ in 0..5 {
        assert_eq!(buy().await.0, 202, "no limit configured yet");
    }
    stack.edit_config(|t| format!("{t}\n[limits.buy]\nuser = {{ per_second = 1, burst = 1 }}\n"));
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut limited = false;
    while Instant::now() < deadline && !limited {
        limited = buy().await.0 == 429;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(limited, "the new per-user limit never applied");
    assert!(stack.log("flashgate").contains("config reloaded"));

    // A broken edit is refused and the running limits stay.
    stack.edit_config(|t| format!("{t}\n[oops]\n"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline && !stack.log("flashgate").contains("config reload rejected") {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        stack.log("flashgate").contains("config reload rejected"),
        "{}",
        stack.log("flashgate")
    );
    // The bucket may have refilled one token meanwhile; two in a row cannot both pass.
    let (a, b) = (buy().await.0, buy().await.0);
    assert!(a == 429 || b == 429, "the running limit was lost: {a}, {b}");
}

/// `systemctl reload` sends SIGHUP: the gateway applies the config file at
/// once and keeps serving. The edit keeps the file's modification time, so
/// the once-a-second check of it cannot be what applied it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_the_config_file_at_once_and_the_gateway_keeps_serving() {
    let mut stack = Stack::start(StackOptions::default()).await;
    stack.open_sale("hup", 1000, 1000).await;
    let buy = |stack: &Stack, user: &str| {
        let (http, addr, token) = (stack.http.clone(), stack.gateway_addr, token(user));
        async move {
            flashgate_tests::buy(&http, addr, "hup", &token, None)
                .await
                .0
        }
    };
    assert_eq!(buy(&stack, "mallory").await, 202, "not denied yet");
    let modified = std::fs::metadata(&stack.config_path)
        .unwrap()
        .modified()
        .unwrap();
    stack.edit_config(|t| format!("{t}\n[deny]\nusers = [\"mallory\"]\n"));
    std::fs::File::options()
        .write(true)
        .open(&stack.config_path)
        .unwrap()
        .set_modified(modified)
        .unwrap();
    let before = stack.log("flashgate").matches("config reloaded").count();
    stack.gateway.as_ref().unwrap().signal("HUP");

    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline
        && stack.log("flashgate").matches("config reloaded").count() == before
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let exited = stack.gateway.as_mut().unwrap().child.try_wait().unwrap();
    assert_eq!(
        exited,
        None,
        "SIGHUP stopped the gateway: {}",
        stack.log("flashgate")
    );
    assert_eq!(
        buy(&stack, "mallory").await,
        403,
        "the deny list was not applied: {}",
        stack.log("flashgate")
    );
    assert_eq!(
        buy(&stack, "steady").await,
        202,
        "the gateway still serves the others"
    );
}

#[test]
fn the_compose_file_is_accepted_by_compose() {
    compose_config(&["-q"]);
}

/// `deploy/docker-compose.yml` as compose resolves it (YAML, from
/// `docker compose` or `docker-compose`), the secrets set to `x`.
fn compose_config(args: &[&str]) -> String {
    let file = workspace_file("deploy/docker-compose.yml");
    let v2 = Command::new("docker")
        .args(["compose", "version"])
        .output()
        .is_ok_and(|o| o.status.success());
    let mut cmd = if v2 {
        let mut c = Command::new("docker");
        c.arg("compose");
        c
    } else {
        Command::new("docker-compose")
    };
    let out = cmd
        .arg("-f")
        .arg(&file)
        .arg("config")
        .args(args)
        .env("FLASHGATE_JWT_SECRET", "x")
        .env("FLASHGATE_ADMIN_TOKEN", "x")
        .env("FLASHGATE_INTERNAL_TOKEN", "x")
        .env("FLASHGATE_SHOP_TOKEN", "x")
        .output()
        .expect("docker compose or docker-compose (make test installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The block of service `name` in a resolved compose file.
fn compose_service<'a>(yaml: &'a str, name: &str) -> &'a str {
    let (_, rest) = yaml
        .split_once(&format!("\n  {name}:\n"))
        .unwrap_or_else(|| panic!("no service {name}:\n{yaml}"));
    let end = rest
        .match_indices('\n')
        .map(|(i, _)| i + 1)
        .find(|&i| {
            let line = &rest[i..];
            !line.starts_with("   ") && !line.is_empty()
        })
        .unwrap_or(rest.len());
    &rest[..end]
}

#[test]
fn compose_runs_an_example_shop_that_the_gateway_reaches_by_its_service_name() {
    use flashgate_common::config::{Config, NoEnv};
    let services = compose_config(&["--services"]);
    assert!(services.lines().any(|s| s == "shop"), "{services}");
    let yaml = compose_config(&[]);
    let shop = compose_service(&yaml, "shop");
    assert!(shop.contains("image: nginx:"), "{shop}");
    // Its site is the one under deploy/compose/shop/.
    assert!(shop.contains("/deploy/compose/shop"), "{shop}");
    assert!(workspace_file("deploy/compose/shop/index.html").is_file());
    let gateway = compose_service(&yaml, "gateway");
    let depends = gateway
        .split_once("depends_on:")
        .map(|(_, d)| d)
        .unwrap_or_default();
    assert!(depends.contains("\n      shop:"), "{gateway}");
    // The gateway's config names the shop by that name, and is valid.
    let text = std::fs::read_to_string(workspace_file("deploy/compose/flashgate.toml")).unwrap();
    assert_eq!(shop_upstreams(&text), ["shop:80"]);
    if let Err(e) = Config::from_toml_str(&text, &NoEnv, 0) {
        panic!("deploy/compose/flashgate.toml: {e}");
    }
}

/// `shop.upstreams` as a config text writes them.
fn shop_upstreams(text: &str) -> Vec<String> {
    let value: toml::Value = toml::from_str(text).unwrap();
    value["shop"]["upstreams"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|u| u.as_str().map(str::to_owned))
        .collect()
}

#[test]
fn the_kubernetes_gateway_reaches_the_shop_service_by_name() {
    use flashgate_common::config::{Config, NoEnv};
    let text =
        kubernetes_config().replace("REPLACE-WITH-INGRESS-CONTROLLER-ADDRESSES", "10.42.7.19");
    assert_eq!(shop_upstreams(&text), ["shop:80"]);
    if let Err(e) = Config::from_toml_str(&text, &NoEnv, 0) {
        panic!("deploy/k8s/configmap.yaml: {e}");
    }
    // The example shop is that Service.
    let shop = std::fs::read_to_string(workspace_file("deploy/k8s/shop.yaml")).unwrap();
    let service = shop
        .split("\n---\n")
        .find(|doc| doc.contains("kind: Service"))
        .expect("a Service in shop.yaml");
    assert!(service.contains("name: shop\n"), "{service}");
    assert!(service.contains("port: 80"), "{service}");
}

#[test]
fn the_image_config_declares_no_sale_and_make_run_keeps_the_demo() {
    use flashgate_common::config::{Config, NoEnv};
    let dockerfile = std::fs::read_to_string(workspace_file("deploy/Dockerfile")).unwrap();
    let source = dockerfile
        .lines()
        .find_map(|l| {
            l.strip_prefix("COPY ")?
                .strip_suffix(" /etc/flashgate/flashgate.toml")
        })
        .expect("the Dockerfile copies a default config");
    let text = std::fs::read_to_string(workspace_file(source)).unwrap();
    assert!(!text.contains("[[sales]]"), "{source} declares a sale");
    let config = Config::from_toml_str(&text, &NoEnv, 0).unwrap();
    assert!(config.sales.is_empty(), "{source}");
    let shipped = std::fs::read_to_string(workspace_file("config/flashgate.toml")).unwrap();
    let config = Config::from_toml_str(&shipped, &NoEnv, 0).unwrap();
    assert_eq!(
        config
            .sales
            .iter()
            .map(|s| s.id.as_str())
            .collect::<Vec<_>>(),
        ["demo"],
        "make run's config keeps the demo sale"
    );
}

#[test]
fn prometheus_alert_rules_pass_promtool() {
    let out = Command::new("promtool")
        .args(["check", "rules"])
        .arg(workspace_file("deploy/prometheus/alerts.yml"))
        .output()
        .expect("promtool (make test installs Debian's prometheus package)");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_gateway_refuses_to_start_without_a_backend_token_of_32_bytes() {
    let dir = TempDir::new("notoken");
    let path = dir.0.join("ok.toml");
    std::fs::write(
        &path,
        format!(
            "[gateway]\nstatic_dir = \"{}\"\n",
            workspace_file("static").display()
        ),
    )
    .unwrap();
    for token in [None, Some("short")] {
        let mut cmd = Command::new(bin("flashgate"));
        cmd.arg("--config")
            .arg(&path)
            .arg("serve")
            .env("FLASHGATE_JWT_SECRET", JWT_SECRET)
            .env_remove("FLASHGATE_INTERNAL_TOKEN");
        if let Some(t) = token {
            cmd.env("FLASHGATE_INTERNAL_TOKEN", t);
        }
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{token:?}: started");
        assert!(
            stderr.contains("FLASHGATE_INTERNAL_TOKEN"),
            "{token:?}: {stderr}"
        );
    }
}

/// The `flashgate.toml` embedded in `deploy/k8s/configmap.yaml`.
fn kubernetes_config() -> String {
    let yaml = std::fs::read_to_string(workspace_file("deploy/k8s/configmap.yaml")).unwrap();
    let (_, body) = yaml
        .split_once("flashgate.toml: |\n")
        .expect("the configmap embeds flashgate.toml");
    body.lines()
        .map(|l| l.strip_prefix("    ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_kubernetes_example_trusts_no_pod_network_and_lets_only_the_ingress_reach_the_gateway() {
    use flashgate_common::config::{Config, NoEnv};
    let text = kubernetes_config();
    // Shipped as is, it names the key to fill in rather than trusting a range.
    let err = Config::from_toml_str(&text, &NoEnv, 0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("limits.trusted_proxies"), "{err}");
    let filled = text.replace("REPLACE-WITH-INGRESS-CONTROLLER-ADDRESSES", "10.42.7.19");
    let config = Config::from_toml_str(&filled, &NoEnv, 0).unwrap();
    let trusted: Vec<String> = config
        .limits
        .trusted_proxies
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(trusted, ["10.42.7.19/32"]);

    let gateway = std::fs::read_to_string(workspace_file("deploy/k8s/gateway.yaml")).unwrap();
    let policy = gateway
        .split("\n---\n")
        .find(|doc| doc.contains("kind: NetworkPolicy"))
        .expect("a NetworkPolicy for the gateway");
    assert!(
        policy.contains("matchLabels: { app: flashgate-gateway }"),
        "{policy}"
    );
    assert!(
        policy.contains("policyTypes: [Ingress]") && policy.contains("port: http"),
        "{policy}"
    );
    assert!(
        policy.contains("app.kubernetes.io/name: ingress-nginx"),
        "{policy}"
    );
}

/// The text of every `.rs` file under `dir` (a crate's `src/`).
fn sources_under(dir: &std::path::Path) -> String {
    let mut text = String::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            text.push_str(&sources_under(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            text.push_str(&std::fs::read_to_string(&path).unwrap());
        }
    }
    text
}

#[test]
fn the_metrics_table_lists_each_metric_once_in_one_table_and_each_is_in_the_code() {
    let doc = std::fs::read_to_string(workspace_file("docs/OPERATIONS.md")).unwrap();
    let section = doc
        .split("\n## Metrics\n")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("a Metrics section");
    let lines: Vec<&str> = section.lines().collect();
    let first = lines
        .iter()
        .position(|l| l.starts_with("| Metric |"))
        .expect("a metrics table");
    let table: Vec<&str> = lines[first..]
        .iter()
        .take_while(|l| l.starts_with('|'))
        .copied()
        .collect();
    let after: Vec<&str> = lines[first + table.len()..]
        .iter()
        .filter(|l| l.starts_with("| `flashgate_"))
        .copied()
        .collect();
    assert!(
        after.is_empty(),
        "metric rows after the table ended (a blank line inside it?): {after:?}"
    );

    let names: Vec<&str> = table
        .iter()
        .filter_map(|l| l.strip_prefix("| `")?.split('`').next())
        .collect();
    assert!(names.len() > 40, "{names:?}");
    let mut twice: Vec<&str> = names
        .iter()
        .filter(|n| names.iter().filter(|m| m == n).count() > 1)
        .copied()
        .collect();
    twice.dedup();
    assert!(twice.is_empty(), "listed more than once: {twice:?}");

    // Registered as `flashgate_` + name (the gateway), or by the full name
    // or `backend_`-less name (the backend).
    let code = sources_under(&workspace_file("gateway/src"))
        + &sources_under(&workspace_file("backend/src"));
    let unknown: Vec<&str> = names
        .iter()
        .filter(|name| {
            let short = name.strip_prefix("flashgate_").unwrap_or(name);
            let shorter = short.strip_prefix("backend_").unwrap_or(short);
            ![*name, short, shorter]
                .iter()
                .any(|n| code.contains(&format!("\"{n}\"")))
        })
        .copied()
        .collect();
    assert!(
        unknown.is_empty(),
        "documented metrics no code registers: {unknown:?}"
    );
}
