//! The `tessera-store` conformance suite against [`PgStore`](tessera_store_postgres::PgStore),
//! each check on a fresh database of this test binary's private PostgreSQL cluster.

tessera_store::store_conformance_tests!(
    make = async {
        tessera_store_postgres::PgStore::connect(&tessera_testdb::database_url())
            .await
            .unwrap()
    }
);
