//! What the binaries refuse at start, and where the gateway keeps its
//! runtime files: short secrets, token claims, the runtime directory and
//! the graceful upgrade through it.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use flashgate_tests::{
    bin, free_port, spawn_as, token, Proc, Stack, StackOptions, TempDir, ADMIN_TOKEN,
    CHALLENGE_SECRET, INTERNAL_TOKEN, JWT_SECRET,
};

/// A config on free ports that would otherwise start; Redis is not needed
/// for a process that must refuse to start.
fn write_config(dir: &Path, extra: &str) -> std::path::PathBuf {
    let p = |_| format!("127.0.0.1:{}", free_port());
    let text = format!(
        "[redis]\nurl = \"redis://127.0.0.1:{}/\"\n[gateway]\nlisten = \"{}\"\nadmin_listen = \"{}\"\nstatic_dir = \"{}\"\nruntime_dir = \"{}\"\n\
         [backend]\nlisten = \"{}\"\nadmin_listen = \"{}\"\ndatabase_url = \"sqlite://{}/fg.db\"\n{extra}",
        free_port(),
        p(0),
        p(1),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../static").display(),
        dir.join("run").display(),
        p(2),
        p(3),
        dir.display(),
    );
    let path = dir.join("flashgate.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Starts `binary` and waits for it to exit; `None` if it keeps running.
fn start_and_wait(
    binary: &'static str,
    args: &[&str],
    config: &Path,
    env: &[(&str, &str)],
    log: &Path,
) -> Option<(bool, String)> {
    let out = std::fs::File::create(log).unwrap();
    let child = Command::new(bin(binary))
        .arg("--config")
        .arg(config)
        .args(args)
        .env_remove("FLASHGATE_JWT_SECRET")
        .env_remove("FLASHGATE_ADMIN_TOKEN")
        .env_remove("FLASHGATE_CHALLENGE_SECRET")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(out)
        .spawn()
        .unwrap();
    let mut proc = Proc {
        child,
        name: binary,
    };
    let status = proc.wait_exit(Duration::from_secs(20))?;
    Some((status.success(), std::fs::read_to_string(log).unwrap()))
}

#[test]
fn short_secrets_are_refused_at_start_naming_the_variable() {
    let dir = TempDir::new("secrets");
    let config = write_config(&dir.0, "");
    let cases = [
        (
            "flashgate",
            vec!["serve"],
            [
                ("FLASHGATE_JWT_SECRET", "replace-me"),
                ("FLASHGATE_ADMIN_TOKEN", ADMIN_TOKEN),
            ],
            "FLASHGATE_JWT_SECRET",
        ),
        (
            "flashgate-backend",
            vec![],
            [
                ("FLASHGATE_JWT_SECRET", JWT_SECRET),
                ("FLASHGATE_ADMIN_TOKEN", "replace-me"),
            ],
            "FLASHGATE_ADMIN_TOKEN",
        ),
        (
            "flashgate",
            vec!["token", "--user", "alice"],
            [
                ("FLASHGATE_JWT_SECRET", "0123456789abcdef0123456789abcde"),
                ("FLASHGATE_ADMIN_TOKEN", ADMIN_TOKEN),
            ],
            "FLASHGATE_JWT_SECRET",
        ),
    ];
    for (binary, args, env, variable) in cases {
        let outcome = start_and_wait(binary, &args, &config, &env, &dir.0.join("out.log"));
        let (ok, stderr) = outcome
            .unwrap_or_else(|| panic!("{binary} {args:?} kept running with a short {variable}"));
        assert!(!ok, "{binary} {args:?} accepted a short {variable}");
        assert!(
            stderr.contains(variable) && stderr.contains("at least 32 bytes"),
            "{binary}: {stderr}"
        );
    }
}

#[test]
fn a_world_writable_runtime_dir_is_refused_at_start() {
    let dir = TempDir::new("rtdir");
    let config = write_config(&dir.0, "");
    let run = dir.0.join("run");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let env = [
        ("FLASHGATE_JWT_SECRET", JWT_SECRET),
        ("FLASHGATE_INTERNAL_TOKEN", INTERNAL_TOKEN),
    ];
    let outcome = start_and_wait(
        "flashgate",
        &["serve"],
        &config,
        &env,
        &dir.0.join("out.log"),
    );
    let (ok, stderr) = outcome.expect("the gateway kept running with a world-writable runtime_dir");
    assert!(!ok);
    assert!(
        stderr.contains("gateway.runtime_dir")
            && stderr.contains("writable by its group or by everyone"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upgrade_socket_lives_in_the_runtime_dir_and_hands_the_listener_over() {
    let mut stack = Stack::start(StackOptions::default()).await;
    stack.open_sale("upgrade", 10, 1).await;
    let run = stack.dir.0.join("run");
    assert_eq!(
        std::fs::metadata(&run).unwrap().permissions().mode() & 0o777,
        0o700,
        "created private"
    );
    let port = stack.gateway_addr.port();
    let socket = run.join(format!("flashgate-{port}-upgrade.sock"));

    // The new binary waits on the upgrade socket for the old one's listeners.
    let _new = spawn_as(
        &stack.dir.0,
        &stack.config_path,
        "flashgate",
        "flashgate-new",
        &["serve", "--upgrade"],
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(socket.exists(), "no upgrade socket in {}", run.display());
    assert!(
        !Path::new(&format!("/tmp/flashgate-{port}-upgrade.sock")).exists(),
        "nothing in the shared temp dir"
    );

    let mut old = stack.gateway.take().unwrap();
    old.signal("QUIT");
    assert!(
        old.wait_exit(Duration::from_secs(20)).is_some(),
        "the old gateway did not hand over and exit"
    );
    let resp = stack
        .http
        .get(stack.url("/flashgate/api/sales/upgrade"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.status().as_u16(),
        200,
        "the new gateway serves on the same port"
    );
    let (status, _) = stack.buy("upgrade", "after-upgrade", None).await;
    assert_eq!(status, 202);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_with_the_wrong_audience_or_issuer_is_401_when_configured() {
    let stack = Stack::start(StackOptions {
        extra_toml: "[auth]\naudience = \"flashgate-test\"\nissuer = \"test-shop\"\n".into(),
        ..StackOptions::default()
    })
    .await;
    stack.open_sale("claims", 10, 1).await;
    let signed = |claims: serde_json::Value| {
        let key = jsonwebtoken::EncodingKey::from_secret(JWT_SECRET.as_bytes());
        jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key).unwrap()
    };
    let exp = flashgate_common::now_ms() / 1000 + 3600;
    let refused = [
        token("no-claims"),
        signed(
            serde_json::json!({"sub": "wrong-aud", "exp": exp, "aud": "another-service", "iss": "test-shop"}),
        ),
        signed(
            serde_json::json!({"sub": "wrong-iss", "exp": exp, "aud": "flashgate-test", "iss": "someone-else"}),
        ),
    ];
    for t in &refused {
        let (status, body) =
            flashgate_tests::buy(&stack.http, stack.gateway_addr, "claims", t, None).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (401, Some("unauthorized")),
            "{t}"
        );
    }
    let right = signed(
        serde_json::json!({"sub": "right", "exp": exp, "aud": "flashgate-test", "iss": "test-shop"}),
    );
    assert_eq!(
        flashgate_tests::buy(&stack.http, stack.gateway_addr, "claims", &right, None)
            .await
            .0,
        202
    );

    // `flashgate token` with the same file mints tokens that pass.
    let out = Command::new(bin("flashgate"))
        .arg("--config")
        .arg(&stack.config_path)
        .args(["token", "--user", "minted"])
        .env("FLASHGATE_JWT_SECRET", JWT_SECRET)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let minted = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        flashgate_tests::buy(
            &stack.http,
            stack.gateway_addr,
            "claims",
            minted.trim(),
            None
        )
        .await
        .0,
        202
    );
}

#[test]
fn with_challenges_on_check_and_serve_name_the_missing_challenge_secret() {
    let dir = TempDir::new("pow-secret");
    let config = write_config(&dir.0, "[challenge]\nmode = \"adaptive\"\n");
    let check = |secret: Option<&str>| {
        let mut cmd = Command::new(bin("flashgate"));
        cmd.arg("--config")
            .arg(&config)
            .arg("check")
            .env_remove("FLASHGATE_CHALLENGE_SECRET");
        if let Some(s) = secret {
            cmd.env("FLASHGATE_CHALLENGE_SECRET", s);
        }
        let out = cmd.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, stderr) = check(None);
    assert!(
        !ok && stderr.contains("FLASHGATE_CHALLENGE_SECRET is not set")
            && stderr.contains("challenge.mode"),
        "{stderr}"
    );
    let (ok, stderr) = check(Some("too-short"));
    assert!(
        !ok && stderr.contains("FLASHGATE_CHALLENGE_SECRET")
            && stderr.contains("at least 32 bytes"),
        "{stderr}"
    );
    assert_eq!(check(Some(CHALLENGE_SECRET)), (true, String::new()));

    let env = [
        ("FLASHGATE_JWT_SECRET", JWT_SECRET),
        ("FLASHGATE_INTERNAL_TOKEN", INTERNAL_TOKEN),
    ];
    let outcome = start_and_wait(
        "flashgate",
        &["serve"],
        &config,
        &env,
        &dir.0.join("out.log"),
    );
    let (ok, stderr) = outcome.expect("the gateway kept running without a challenge secret");
    assert!(
        !ok && stderr.contains("FLASHGATE_CHALLENGE_SECRET"),
        "{stderr}"
    );
}
