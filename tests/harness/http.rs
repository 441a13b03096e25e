//! Raw HTTP for tests: no redirects followed, every status visible.

use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;

pub fn client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(10))
            .build()
            .expect("http client")
    })
}

/// A response as tests look at it.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub location: Option<String>,
    pub body: Value,
}

async fn reply(r: reqwest::Response) -> Reply {
    let status = r.status().as_u16();
    let location = r.headers().get("location").and_then(|v| v.to_str().ok()).map(str::to_string);
    let text = r.text().await.unwrap_or_default();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Reply { status, location, body }
}

pub async fn get(url: &str) -> Result<Reply, reqwest::Error> {
    Ok(reply(client().get(url).send().await?).await)
}

/// The value of metric `name` (its line `name value`) in `url`'s `/metrics`; `None` when the
/// node does not answer or does not list it.
pub async fn metric(url: &str, name: &str) -> Option<u64> {
    let text = client().get(format!("{url}/metrics")).send().await.ok()?.text().await.ok()?;
    text.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

pub async fn get_json(url: &str) -> Result<(u16, Value), reqwest::Error> {
    let r = get(url).await?;
    Ok((r.status, r.body))
}

pub async fn post(url: &str, body: &Value) -> Result<Reply, reqwest::Error> {
    Ok(reply(client().post(url).json(body).send().await?).await)
}

pub async fn post_raw(url: &str, body: impl Into<reqwest::Body>) -> Result<Reply, reqwest::Error> {
    Ok(reply(client().post(url).header("content-type", "application/json").body(body).send().await?).await)
}

pub async fn delete(url: &str) -> Result<Reply, reqwest::Error> {
    Ok(reply(client().delete(url).send().await?).await)
}

pub async fn send(request: reqwest::RequestBuilder) -> Result<Reply, reqwest::Error> {
    Ok(reply(request.send().await?).await)
}
