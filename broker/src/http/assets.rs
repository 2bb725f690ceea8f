//! The dashboard page and its script and style, embedded in the binary
//! (`include_str!`): no separate server, no CDN, nothing fetched from
//! outside the broker.

use super::Response;

const INDEX: &str = include_str!("../../assets/dashboard.html");
const SCRIPT: &str = include_str!("../../assets/dashboard.js");
const STYLE: &str = include_str!("../../assets/dashboard.css");

/// The asset at `path`, if there is one.
pub fn get(path: &str) -> Option<Response> {
    let (ctype, body) = match path {
        "/" | "/index.html" => ("text/html; charset=utf-8", INDEX),
        "/dashboard.js" => ("application/javascript; charset=utf-8", SCRIPT),
        "/dashboard.css" => ("text/css; charset=utf-8", STYLE),
        // Browsers ask for it; an empty answer keeps the console clean.
        "/favicon.ico" => ("image/x-icon", ""),
        _ => return None,
    };
    Some(Response::ok(ctype, body.to_owned()))
}
