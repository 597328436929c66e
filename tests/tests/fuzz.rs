//! Property tests on arbitrary input (a few hundred cases each): request
//! routing, token verification and config parsing never panic, and what
//! they accept is well-formed.

use flashgate_common::config::{Config, NoEnv};
use flashgate_gateway::admission::Verifier;
use flashgate_gateway::edge::{Route, Routes};
use http::Method;
use proptest::prelude::*;

fn methods() -> impl Strategy<Value = Method> {
    prop_oneof![
        Just(Method::GET),
        Just(Method::HEAD),
        Just(Method::POST),
        Just(Method::PUT),
        Just(Method::DELETE)
    ]
}

fn paths() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "/flashgate/api/sales/[a-zA-Z0-9_%./-]{0,80}(/buy)?",
        "/flashgate/api/reservations/[a-z0-9.]{0,80}",
        "/flashgate/(sales|static)/.{0,40}",
        "/drops/.{0,40}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn routing_never_panics_and_accepts_only_valid_ids(method in methods(), path in paths()) {
        let routes = Routes::new("/flashgate", Some("/drops/{id}"));
        match routes.classify(&method, &path) {
            Ok(Route::Buy(id)) | Ok(Route::SaleState(id)) | Ok(Route::SalePage(id)) => {
                prop_assert!(flashgate_common::sale::valid_sale_id(id), "{id}");
            }
            Ok(Route::Reservation(rid)) => {
                prop_assert!(flashgate_common::reservation::sale_of_reservation(rid).is_some(), "{rid}");
            }
            _ => {}
        }
    }

    #[test]
    fn token_verification_never_panics(header in proptest::collection::vec(any::<u8>(), 0..600), jwtish in "Bearer [A-Za-z0-9_=.-]{0,300}") {
        let v = Verifier::new(b"secret");
        let _ = v.verify(Some(&header));
        if let Ok(user) = v.verify(Some(jwtish.as_bytes())) {
            prop_assert!(flashgate_gateway::admission::valid_user_id(&user));
        }
    }

    #[test]
    fn config_parsing_never_panics(text in any::<String>(), key in "[a-z_]{1,20}", value in "[0-9a-z\"._:/-]{0,20}") {
        let _ = Config::from_toml_str(&text, &NoEnv, 0);
        let _ = Config::from_toml_str(&format!("[backend]\n{key} = {value}\n"), &NoEnv, 0);
        let _ = Config::from_toml_str(&format!("[[sales]]\nid = \"s\"\nname = \"n\"\nstock = 1\n{key} = {value}\n"), &NoEnv, 0);
    }

    #[test]
    fn sale_and_reservation_ids_never_panic(s in any::<String>()) {
        let _ = flashgate_common::sale::valid_sale_id(&s);
        if let Some(sale) = flashgate_common::reservation::sale_of_reservation(&s) {
            prop_assert!(flashgate_common::sale::valid_sale_id(sale));
        }
    }
}
