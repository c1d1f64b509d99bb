//! The console's static files, embedded in the binary (`rust-embed`, also in debug builds) from
//! `console/assets/`: our stylesheet and script, and htmx and uPlot vendored from npm (with
//! their licences; `scripts/vendor-console.sh` refreshes them). Each is served at
//! `/assets/<hash>/<file>`, where the hash is the first 12 hex digits of the file's SHA-256:
//! the URL changes with the content, so the answer may be cached for a year (`immutable`).

use std::collections::HashMap;
use std::sync::OnceLock;

use axum::extract::Path;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use rust_embed::RustEmbed;
use sha2::{Digest, Sha256};

use crate::problem::ApiError;

#[derive(RustEmbed)]
#[folder = "console/assets/"]
struct Files;

/// The URL of every asset a page links to.
pub struct Urls {
    pub css: String,
    pub js: String,
    pub htmx: String,
    pub uplot_js: String,
    pub uplot_css: String,
    /// File name → content hash.
    hashes: HashMap<String, String>,
}

fn hash_of(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .take(6)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The asset URLs (hashed once, at first use).
pub fn urls() -> &'static Urls {
    static URLS: OnceLock<Urls> = OnceLock::new();
    URLS.get_or_init(|| {
        let hashes: HashMap<String, String> = Files::iter()
            .filter_map(|name| Files::get(&name).map(|f| (name.to_string(), hash_of(&f.data))))
            .collect();
        let url = |name: &str| match hashes.get(name) {
            Some(h) => format!("/assets/{h}/{name}"),
            None => panic!("console asset {name} is not embedded"),
        };
        Urls {
            css: url("console.css"),
            js: url("console.js"),
            htmx: url("vendor/htmx.min.js"),
            uplot_js: url("vendor/uPlot.iife.min.js"),
            uplot_css: url("vendor/uPlot.min.css"),
            hashes,
        }
    })
}

/// `GET /assets/{hash}/{file}`: the file, if the hash is its current one.
pub async fn serve(Path((hash, file)): Path<(String, String)>) -> Response {
    let current = urls().hashes.get(&file);
    let (Some(current), Some(f)) = (current, Files::get(&file)) else {
        return ApiError::not_found(format!("no asset {file}")).into_response();
    };
    if *current != hash {
        return ApiError::not_found(format!("{file} has changed; reload the page")).into_response();
    }
    let mime = f.metadata.mimetype().to_string();
    let mut r = f.data.into_owned().into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_str(&mime).unwrap_or(HeaderValue::from_static("application/octet-stream")),
    );
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=31536000, immutable"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_linked_asset_is_embedded_with_its_licence() {
        let u = urls();
        for url in [&u.css, &u.js, &u.htmx, &u.uplot_js, &u.uplot_css] {
            let (hash, name) = url["/assets/".len()..].split_once('/').unwrap();
            let f = Files::get(name).unwrap_or_else(|| panic!("{name} embedded"));
            assert_eq!(hash, hash_of(&f.data), "{name}: the URL carries the content hash");
        }
        assert!(Files::get("vendor/htmx.LICENSE").is_some());
        assert!(Files::get("vendor/uPlot.LICENSE").is_some());
    }
}
