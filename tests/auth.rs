//! Authentication (issue "security"): the auth file's exact shape, API keys
//! compared by digest, and JWTs checked for signature, algorithm, issuer,
//! audience and time. Keys in `tests/fixtures/auth/` exist for these tests
//! only.

use crate::support;

use a2a_lifecycle::auth::{AuthError, Authenticator, Principal, Role, Tenants};
use jsonwebtoken::{Algorithm, EncodingKey, Header};

use support::jwt::{claims, fixtures, key_digest, now, sign};

const CI_BOT_KEY: &str = "ci-bot-test-key-8c1f";
const ADMIN_KEY: &str = "admin-test-key-77aa";

/// The issue's example file, with the test keys' digests.
fn auth_file() -> String {
    format!(
        r#"
[[principal]]
name = "ci-bot"
# SHA-256 of the API key, lowercase hex: the key itself is never stored
api_key_sha256 = "{}"
tenants = ["", "code-reviewer"]   # tenants it may use; "*" means all
role = "user"                     # "user": its own tasks only; "admin": all tasks of its tenants

[[principal]]
name = "ops"
api_key_sha256 = "{}"
tenants = ["*"]
role = "admin"

[jwt]                             # optional: bearer JWTs from an identity provider
issuer = "https://id.example.test"
audience = "a2a-lifecycle"
jwks_file = "jwks.json"           # local JSON Web Key Set (RS256, ES256); no network fetch
tenants_claim = "tenants"         # array of tenant names, "*" for all
admin_claim = "a2a_admin"         # boolean; true gives the admin role
"#,
        key_digest(CI_BOT_KEY),
        key_digest(ADMIN_KEY),
    )
}

fn authenticator() -> Authenticator {
    Authenticator::parse(&auth_file(), &fixtures()).expect("the issue's file shape parses")
}

fn bearer(credential: &str) -> String {
    format!("Bearer {credential}")
}

#[test]
fn api_keys_name_their_principal() {
    let auth = authenticator();
    let bot = auth.authenticate(Some(&bearer(CI_BOT_KEY))).unwrap();
    assert_eq!(
        bot,
        Principal {
            name: "ci-bot".into(),
            tenants: Tenants::Only(vec!["".into(), "code-reviewer".into()]),
            role: Role::User,
            quota: Default::default(),
        }
    );
    assert!(bot.may_use("") && bot.may_use("code-reviewer") && !bot.may_use("deployer"));
    let ops = auth
        .authenticate(Some(&format!("bearer  {ADMIN_KEY} ")))
        .unwrap();
    assert_eq!((ops.name.as_str(), ops.role), ("ops", Role::Admin));
    assert!(ops.may_use("anything"));
}

/// An API key shaped like a JWT (three dot-separated parts) is still an
/// API key.
#[test]
fn an_api_key_with_two_dots_is_a_key() {
    let key = "part.two.three";
    let file = format!(
        "[[principal]]\nname = \"dotted\"\napi_key_sha256 = \"{}\"\ntenants = [\"\"]\nrole = \"user\"\n",
        key_digest(key)
    );
    let auth = Authenticator::parse(&file, &fixtures()).unwrap();
    assert_eq!(
        auth.authenticate(Some(&bearer(key))).unwrap().name,
        "dotted"
    );
    assert!(matches!(
        auth.authenticate(Some(&bearer("other.two.three"))),
        Err(AuthError::InvalidToken(_))
    ));
}

#[test]
fn missing_malformed_and_unknown_credentials_are_refused() {
    let auth = authenticator();
    assert_eq!(auth.authenticate(None), Err(AuthError::Missing));
    for value in ["", "Bearer", "Bearer   ", "Basic Y2k6Ym90", CI_BOT_KEY] {
        assert_eq!(
            auth.authenticate(Some(value)),
            Err(AuthError::Malformed),
            "{value:?}"
        );
    }
    let huge = bearer(&"k".repeat(a2a_lifecycle::auth::MAX_CREDENTIAL_BYTES));
    assert_eq!(auth.authenticate(Some(&huge)), Err(AuthError::Malformed));
    for wrong in ["ci-bot-test-key-8c1e", "CI-BOT-TEST-KEY-8C1F", "x"] {
        assert_eq!(
            auth.authenticate(Some(&bearer(wrong))),
            Err(AuthError::UnknownKey)
        );
    }
}

#[test]
fn jwts_from_the_key_set_name_their_subject() {
    let auth = authenticator();
    let rs = sign(
        Algorithm::RS256,
        "rs-1",
        "rs256-test-key.pem",
        &claims("alice", |_| {}),
    );
    let alice = auth.authenticate(Some(&bearer(&rs))).unwrap();
    assert_eq!(
        alice,
        Principal {
            name: "alice".into(),
            tenants: Tenants::Only(vec!["deployer".into()]),
            role: Role::User,
            quota: Default::default(),
        }
    );
    let es = sign(
        Algorithm::ES256,
        "es-1",
        "es256-test-key.pem",
        &claims("root", |c| {
            c["tenants"] = "*".into();
            c["a2a_admin"] = true.into();
        }),
    );
    let root = auth.authenticate(Some(&bearer(&es))).unwrap();
    assert_eq!(root.role, Role::Admin);
    assert_eq!(root.tenants, Tenants::All);
}

#[test]
fn bad_jwts_are_refused() {
    let auth = authenticator();
    let refused = |token: &str, why: &str| match auth.authenticate(Some(&bearer(token))) {
        Err(AuthError::InvalidToken(_)) => {}
        other => panic!("{why}: {other:?}"),
    };
    let rs = |edit: &dyn Fn(&mut serde_json::Value)| {
        sign(
            Algorithm::RS256,
            "rs-1",
            "rs256-test-key.pem",
            &claims("mallory", |c| edit(c)),
        )
    };
    refused(&rs(&|c| c["exp"] = (now() - 3600).into()), "expired");
    refused(&rs(&|c| c["nbf"] = (now() + 3600).into()), "not yet valid");
    refused(
        &rs(&|c| c["iss"] = "https://evil.example".into()),
        "wrong issuer",
    );
    refused(
        &rs(&|c| c["aud"] = "another-service".into()),
        "wrong audience",
    );
    refused(&rs(&|c| c["sub"] = "".into()), "empty subject");
    refused(
        &rs(&|c| {
            c.as_object_mut().unwrap().remove("exp");
        }),
        "no expiry",
    );
    refused(
        &rs(&|c| c["tenants"] = "deployer".into()),
        "tenants not a list",
    );
    refused(
        &rs(&|c| c["a2a_admin"] = "yes".into()),
        "admin not a boolean",
    );
    // Signed by a key outside the set, under a kid of the set.
    refused(
        &sign(
            Algorithm::RS256,
            "rs-1",
            "forger-test-key.pem",
            &claims("mallory", |_| {}),
        ),
        "forged signature",
    );
    // A key of the set used with another algorithm than its own.
    refused(
        &sign(
            Algorithm::RS384,
            "rs-1",
            "rs256-test-key.pem",
            &claims("mallory", |_| {}),
        ),
        "another algorithm",
    );
    refused(
        &sign(
            Algorithm::RS256,
            "nope",
            "rs256-test-key.pem",
            &claims("mallory", |_| {}),
        ),
        "unknown kid",
    );
    // alg none, hand-made: no signature at all.
    let b64 = |v: &serde_json::Value| {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    let none = format!(
        "{}.{}.",
        b64(&serde_json::json!({"alg": "none", "typ": "JWT", "kid": "rs-1"})),
        b64(&claims("mallory", |_| {}))
    );
    refused(&none, "alg none");
    // HS256 keyed with the RSA key's public modulus (algorithm confusion).
    let jwks: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("jwks.json")).unwrap())
            .unwrap();
    let n = jwks["keys"][0]["n"].as_str().unwrap().to_owned();
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some("rs-1".into());
    let hs = jsonwebtoken::encode(
        &header,
        &claims("mallory", |_| {}),
        &EncodingKey::from_secret(n.as_bytes()).unwrap(),
    )
    .unwrap();
    refused(&hs, "HS256 confusion");
}

/// Rotation: a principal may list several key digests, each of which
/// authenticates it; a principal without a key authenticates only by its
/// certificate; `reload` puts a changed file in force and keeps the old
/// one when the new one does not load.
#[test]
fn keys_rotate_and_files_reload() {
    let dir = std::env::temp_dir().join(format!("a2a-auth-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("auth.toml");
    let write = |digests: &str| {
        std::fs::write(
            &file,
            format!(
                "[[principal]]\nname = \"ci\"\napi_key_sha256 = {digests}\ntenants = [\"*\"]\nrole = \"user\"\n\n\
                 [[principal]]\nname = \"edge\"\ntenants = [\"*\"]\nrole = \"admin\"\n"
            ),
        )
        .unwrap()
    };
    let quoted = |key: &str| format!("\"{}\"", key_digest(key));
    write(&format!("[{}, {}]", quoted("old"), quoted("new")));
    let auth = Authenticator::load(&file).unwrap();
    for key in ["old", "new"] {
        assert_eq!(auth.authenticate(Some(&bearer(key))).unwrap().name, "ci");
    }
    // No key: only a certificate names it.
    assert_eq!(
        auth.authenticate_certificate("edge").unwrap().role,
        Role::Admin
    );
    assert!(matches!(
        auth.authenticate_certificate("nobody"),
        Err(AuthError::UnknownCertificate(_))
    ));
    assert!(auth.authenticate(Some(&bearer("edge"))).is_err());
    // A bearer credential, when sent, is what authenticates.
    assert_eq!(
        auth.authenticate_request(Some(&bearer("new")), Some("edge"))
            .unwrap()
            .name,
        "ci"
    );
    assert!(
        auth.authenticate_request(Some(&bearer("wrong")), Some("edge"))
            .is_err()
    );

    write(&quoted("new"));
    assert!(auth.reload().unwrap());
    assert!(matches!(
        auth.authenticate(Some(&bearer("old"))),
        Err(AuthError::UnknownKey)
    ));
    assert_eq!(auth.authenticate(Some(&bearer("new"))).unwrap().name, "ci");
    std::fs::write(&file, "[[principal]]\nname = \"broken\"\n").unwrap();
    assert!(auth.reload().is_err());
    assert_eq!(
        auth.authenticate(Some(&bearer("new"))).unwrap().name,
        "ci",
        "a file that does not load leaves the old one in force"
    );
    let twice = format!(
        "[[principal]]\nname = \"a\"\napi_key_sha256 = {}\ntenants = []\nrole = \"user\"\n\n\
         [[principal]]\nname = \"a\"\napi_key_sha256 = {}\ntenants = []\nrole = \"user\"\n",
        quoted("k1"),
        quoted("k2")
    );
    assert!(
        Authenticator::parse(&twice, &fixtures()).is_err(),
        "a name listed twice"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A verified JWT is remembered (a client sends one token with many
/// calls), and forgotten when the file is reloaded: a token the new file
/// does not accept is refused at once.
#[test]
fn verified_jwts_are_remembered_until_a_reload() {
    let dir = std::env::temp_dir().join(format!("a2a-jwt-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("auth.toml");
    let jwt = format!(
        "[jwt]\nissuer = \"https://id.example.test\"\naudience = \"a2a-lifecycle\"\n\
         jwks_file = \"{}\"\ntenants_claim = \"tenants\"\nadmin_claim = \"a2a_admin\"\n",
        fixtures().join("jwks.json").display()
    );
    std::fs::write(&file, &jwt).unwrap();
    let auth = Authenticator::load(&file).unwrap();
    let token = bearer(&sign(
        Algorithm::RS256,
        "rs-1",
        "rs256-test-key.pem",
        &claims("alice", |_| {}),
    ));
    for _ in 0..3 {
        let alice = auth.authenticate(Some(&token)).unwrap();
        assert_eq!(alice.name, "alice");
        assert_eq!(alice.tenants, Tenants::Only(vec!["deployer".into()]));
    }
    // The same issuer, now with a file principal named alice: the
    // remembered token goes with the old file.
    std::fs::write(
        &file,
        format!(
            "[[principal]]\nname = \"alice\"\napi_key_sha256 = \"{}\"\ntenants = []\nrole = \"user\"\n\n{jwt}",
            key_digest("k")
        ),
    )
    .unwrap();
    assert!(auth.reload().unwrap());
    assert!(matches!(
        auth.authenticate(Some(&token)),
        Err(AuthError::InvalidToken(_))
    ));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A JWT whose `sub` is the name of a principal of the file is refused:
/// the provider may not hand out that principal's tasks.
#[test]
fn a_jwt_may_not_name_a_principal_of_the_file() {
    let auth = authenticator();
    let token = sign(
        Algorithm::RS256,
        "rs-1",
        "rs256-test-key.pem",
        &claims("ci-bot", |_| {}),
    );
    assert!(matches!(
        auth.authenticate(Some(&bearer(&token))),
        Err(AuthError::InvalidToken(_))
    ));
}

/// A server with no [jwt] refuses every JWT, and an auth file nobody could
/// use, or with a malformed digest, is refused at load.
#[test]
fn auth_files_are_checked_at_load() {
    let keys_only = auth_file().split("[jwt]").next().unwrap().to_owned();
    let auth = Authenticator::parse(&keys_only, &fixtures()).unwrap();
    let rs = sign(
        Algorithm::RS256,
        "rs-1",
        "rs256-test-key.pem",
        &claims("alice", |_| {}),
    );
    assert!(matches!(
        auth.authenticate(Some(&bearer(&rs))),
        Err(AuthError::InvalidToken(_))
    ));
    for bad in [
        "",
        "[[principal]]\nname = \"x\"\napi_key_sha256 = \"ABC\"\ntenants = []\nrole = \"user\"\n",
        "[[principal]]\nname = \"x\"\napi_key_sha256 = \"00\"\ntenants = []\nrole = \"root\"\n",
        "[[principal]]\nname = \"x\"\napi_key = \"plain\"\ntenants = []\nrole = \"user\"\n",
        // An empty name would own the tasks created without authentication.
        &format!(
            "[[principal]]\nname = \"\"\napi_key_sha256 = \"{}\"\ntenants = []\nrole = \"user\"\n",
            "0".repeat(64)
        ),
    ] {
        assert!(
            Authenticator::parse(bad, &fixtures()).is_err(),
            "accepted: {bad:?}"
        );
    }
    let missing_jwks = auth_file().replace("jwks.json", "no-such.json");
    let err = Authenticator::parse(&missing_jwks, &fixtures()).unwrap_err();
    assert!(err.contains("no-such.json"), "{err}");
}

/// Random `authorization` values and tokens (seeded, so a failure
/// repeats) never authenticate.
#[test]
fn random_credentials_never_authenticate() {
    let auth = authenticator();
    let seed: u64 = std::env::var("A2A_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x05ee_da17);
    let iterations: usize = std::env::var("A2A_FUZZ_ITERATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000);
    let mut state = seed;
    let mut next = move || {
        // xorshift64*
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let valid = sign(
        Algorithm::RS256,
        "rs-1",
        "rs256-test-key.pem",
        &claims("alice", |_| {}),
    );
    for i in 0..iterations {
        let len = (next() % 200) as usize;
        let candidate: String = match i % 4 {
            // Arbitrary bytes as text.
            0 => (0..len)
                .map(|_| char::from_u32((next() % 0x2_0000) as u32).unwrap_or('x'))
                .collect(),
            // Bearer plus printable noise.
            1 => format!(
                "Bearer {}",
                (0..len)
                    .map(|_| (b'!' + (next() % 94) as u8) as char)
                    .collect::<String>()
            ),
            // A valid token with one character changed.
            2 => {
                let mut bytes = valid.clone().into_bytes();
                let at = (next() as usize) % bytes.len();
                let replacement = b'A' + (next() % 26) as u8;
                if bytes[at] == replacement || bytes[at] == b'.' {
                    continue;
                }
                bytes[at] = replacement;
                bearer(&String::from_utf8(bytes).unwrap())
            }
            // Three random dot-separated parts.
            _ => bearer(
                &(0..3)
                    .map(|_| {
                        (0..len / 3 + 1)
                            .map(|_| (b'a' + (next() % 26) as u8) as char)
                            .collect::<String>()
                    })
                    .collect::<Vec<_>>()
                    .join("."),
            ),
        };
        assert!(
            auth.authenticate(Some(&candidate)).is_err(),
            "authenticated (seed {seed}, round {i}): {candidate:?}"
        );
    }
}
