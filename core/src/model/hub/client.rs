//! The Hub's HTTP protocol: the revision API (commit and file list), `resolve` metadata
//! (ETag, size, commit, where the content lives) and the Hub's error headers.

use std::time::Duration;

use reqwest::header::{HeaderMap, LOCATION};
use reqwest::{Method, StatusCode, Url};
use serde::Deserialize;

use super::{HubError, HubSettings, RepoRef};

/// Which call an error came from, to name the right missing thing.
#[derive(Debug, Clone, Copy)]
pub enum Call<'a> {
    Revision,
    File(&'a str),
}

#[derive(Debug, Deserialize)]
struct Sibling {
    rfilename: String,
}

#[derive(Debug, Deserialize)]
struct RevisionInfo {
    sha: Option<String>,
    #[serde(default)]
    siblings: Option<Vec<Sibling>>,
}

/// A revision of a repository: its commit and every file in it.
#[derive(Debug, Clone)]
pub struct RepoInfo {
    pub commit: String,
    pub files: Vec<String>,
}

/// What `HEAD .../resolve/<commit>/<file>` tells about a file.
#[derive(Debug, Clone)]
pub struct FileMeta {
    /// sha256 of an LFS file, git blob id of a small one; names the blob in the cache.
    pub etag: String,
    pub size: Option<u64>,
    /// Where to GET the content (a CDN for LFS files).
    pub location: Url,
}

pub struct HubClient {
    http: reqwest::Client,
    /// Same as `http`, but never follows a redirect (for HEAD: a redirect to the CDN carries
    /// the metadata; only relative ones, for renamed repositories, are followed by hand).
    head_http: reqwest::Client,
    endpoint: Url,
    token: Option<String>,
    repo: String,
}

/// Normalize an ETag header to what names a blob: no `W/` prefix, no quotes.
pub fn normalize_etag(raw: &str) -> String {
    raw.trim()
        .trim_start_matches("W/")
        .trim_matches('"')
        .to_string()
}

impl HubClient {
    pub fn new(settings: &HubSettings, repo: &RepoRef) -> Result<Self, HubError> {
        let endpoint = Url::parse(&settings.endpoint).map_err(|e| {
            HubError::InvalidRepoId(format!(
                "HF_ENDPOINT {:?} is not a URL: {e}",
                settings.endpoint
            ))
        })?;
        let build = |redirects: reqwest::redirect::Policy| {
            reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(10))
                .read_timeout(Duration::from_secs(60))
                .redirect(redirects)
                .user_agent(concat!("sgl-engine/", env!("CARGO_PKG_VERSION")))
                .build()
                .map_err(|e| HubError::BadResponse(format!("HTTP client: {e}")))
        };
        Ok(HubClient {
            http: build(reqwest::redirect::Policy::limited(10))?,
            head_http: build(reqwest::redirect::Policy::none())?,
            endpoint,
            token: settings.token.clone(),
            repo: repo.id.clone(),
        })
    }

    pub fn endpoint(&self) -> String {
        self.endpoint.as_str().trim_end_matches('/').to_string()
    }

    /// `endpoint` + path segments, each percent-encoded (a revision `refs/pr/1` is one segment).
    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.endpoint.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty();
            path.extend(segments);
        }
        url
    }

    fn file_url(&self, revision: &str, file: &str) -> Url {
        let mut segments: Vec<&str> = self.repo.split('/').collect();
        segments.extend(["resolve", revision]);
        segments.extend(file.split('/'));
        self.url(&segments)
    }

    /// The token goes only to the Hub's own host, never to a CDN it redirects to.
    fn request(
        &self,
        client: &reqwest::Client,
        method: Method,
        url: Url,
    ) -> reqwest::RequestBuilder {
        let same_host =
            url.host_str() == self.endpoint.host_str() && url.port() == self.endpoint.port();
        let mut req = client.request(method, url);
        if let (Some(t), true) = (&self.token, same_host) {
            req = req.bearer_auth(t);
        }
        req
    }

    pub fn network_error(&self, e: &reqwest::Error) -> HubError {
        let mut message = e.to_string();
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            message = format!("{message}: {s}");
            source = s.source();
        }
        HubError::Network {
            endpoint: self.endpoint(),
            message,
        }
    }

    /// The commit `revision` names and the repository's files at it.
    pub async fn repo_info(&self, revision: &str) -> Result<RepoInfo, HubError> {
        let mut segments = vec!["api", "models"];
        segments.extend(self.repo.split('/'));
        segments.extend(["revision", revision]);
        let url = self.url(&segments);
        let resp = self
            .request(&self.http, Method::GET, url.clone())
            .send()
            .await
            .map_err(|e| self.network_error(&e))?;
        if !resp.status().is_success() {
            return Err(self.status_error(resp, revision, Call::Revision).await);
        }
        let info: RevisionInfo = resp.json().await.map_err(|e| {
            HubError::BadResponse(format!(
                "{url}: the revision API answered something unexpected: {e}"
            ))
        })?;
        let commit = info
            .sha
            .filter(|s| super::cache::is_commit(s))
            .ok_or_else(|| {
                HubError::BadResponse(format!("{url}: no commit id (sha) in the answer"))
            })?;
        let files = info
            .siblings
            .ok_or_else(|| {
                HubError::BadResponse(format!("{url}: no file list (siblings) in the answer"))
            })?
            .into_iter()
            .map(|s| s.rfilename)
            .collect();
        Ok(RepoInfo { commit, files })
    }

    /// `HEAD .../resolve/<commit>/<file>`, following relative redirects only.
    pub async fn file_meta(&self, commit: &str, file: &str) -> Result<FileMeta, HubError> {
        let mut url = self.file_url(commit, file);
        for _ in 0..10 {
            let resp = self
                .request(&self.head_http, Method::HEAD, url.clone())
                .header(reqwest::header::ACCEPT_ENCODING, "identity")
                .send()
                .await
                .map_err(|e| self.network_error(&e))?;
            let status = resp.status();
            let headers = resp.headers().clone();
            let location = header(&headers, LOCATION.as_str());
            if status.is_redirection() {
                let Some(loc) = location else {
                    return Err(HubError::BadResponse(format!(
                        "{url}: redirect without Location"
                    )));
                };
                let relative = Url::parse(&loc).is_err();
                let target = url.join(&loc).map_err(|e| {
                    HubError::BadResponse(format!("{url}: bad Location {loc:?}: {e}"))
                })?;
                if relative {
                    url = target;
                    continue;
                }
                return self.meta_from(&headers, status, target, file);
            }
            if !status.is_success() {
                return Err(self.status_error(resp, commit, Call::File(file)).await);
            }
            return self.meta_from(&headers, status, url, file);
        }
        Err(HubError::BadResponse(format!("{url}: too many redirects")))
    }

    fn meta_from(
        &self,
        headers: &HeaderMap,
        status: StatusCode,
        location: Url,
        file: &str,
    ) -> Result<FileMeta, HubError> {
        let etag = header(headers, "x-linked-etag")
            .or_else(|| header(headers, "etag"))
            .map(|e| normalize_etag(&e))
            .filter(|e| !e.is_empty() && !e.contains(['/', '\\']) && e != "." && e != "..")
            .ok_or_else(|| HubError::BadResponse(format!("{file}: the Hub sent no ETag")))?;
        let size = header(headers, "x-linked-size")
            .or_else(|| {
                (!status.is_redirection())
                    .then(|| header(headers, "content-length"))
                    .flatten()
            })
            .and_then(|s| s.parse().ok());
        Ok(FileMeta {
            etag,
            size,
            location,
        })
    }

    /// GET the content from `offset` on (a range request when `offset > 0`).
    pub async fn get_content(
        &self,
        location: &Url,
        offset: u64,
    ) -> Result<reqwest::Response, HubError> {
        let mut req = self
            .request(&self.http, Method::GET, location.clone())
            .header(reqwest::header::ACCEPT_ENCODING, "identity");
        if offset > 0 {
            req = req.header(reqwest::header::RANGE, format!("bytes={offset}-"));
        }
        let resp = req.send().await.map_err(|e| self.network_error(&e))?;
        let status = resp.status();
        if status.is_success() || status == StatusCode::RANGE_NOT_SATISFIABLE {
            return Ok(resp);
        }
        let path = location.path().to_string();
        Err(self.status_error(resp, "", Call::File(&path)).await)
    }

    /// Turn a failed answer into the error a person can act on, using the Hub's
    /// `X-Error-Code` / `X-Error-Message` headers where it sent them.
    pub async fn status_error(
        &self,
        resp: reqwest::Response,
        revision: &str,
        call: Call<'_>,
    ) -> HubError {
        let status = resp.status();
        let url = resp.url().to_string();
        let code = header(resp.headers(), "x-error-code").unwrap_or_default();
        let header_message = header(resp.headers(), "x-error-message");
        let body = resp.text().await.unwrap_or_default();
        let message = header_message
            .or_else(|| {
                serde_json::from_str::<serde_json::Value>(&body)
                    .ok()
                    .and_then(|v| v.get("error")?.as_str().map(str::to_string))
            })
            .unwrap_or_else(|| {
                let b = body.trim();
                if b.is_empty() || b.len() > 300 {
                    status.canonical_reason().unwrap_or("error").to_string()
                } else {
                    b.to_string()
                }
            });
        let repo = self.repo.clone();
        match (code.as_str(), status.as_u16()) {
            ("RevisionNotFound", _) => HubError::RevisionNotFound {
                repo,
                revision: revision.to_string(),
            },
            ("GatedRepo", _) => HubError::Unauthorized {
                repo,
                gated: true,
                message: match &self.token {
                    None => format!("it is gated and no token was sent ({message})"),
                    Some(_) => format!("HF_TOKEN has no access to this gated model ({message})"),
                },
            },
            ("EntryNotFound", _) => HubError::FileNotFound {
                repo,
                revision: revision.to_string(),
                file: match call {
                    Call::File(f) => f.to_string(),
                    Call::Revision => String::new(),
                },
            },
            (_, 401) if self.token.is_some() => HubError::Unauthorized {
                repo,
                gated: false,
                message: format!("HF_TOKEN was refused ({message})"),
            },
            (_, 403) => HubError::Unauthorized {
                repo,
                gated: false,
                message: match &self.token {
                    None => format!("access is restricted and no token was sent ({message})"),
                    Some(_) => format!("HF_TOKEN may not read it ({message})"),
                },
            },
            ("RepoNotFound", _) | (_, 401) => HubError::RepoNotFound {
                repo,
                endpoint: self.endpoint(),
            },
            (_, 404) => match call {
                Call::Revision => HubError::RepoNotFound {
                    repo,
                    endpoint: self.endpoint(),
                },
                Call::File(f) => HubError::FileNotFound {
                    repo,
                    revision: revision.to_string(),
                    file: f.to_string(),
                },
            },
            _ => HubError::Http {
                url,
                status: status.as_u16(),
                message,
            },
        }
    }
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::normalize_etag;

    #[test]
    fn etags_lose_quotes_and_weak_prefix() {
        assert_eq!(normalize_etag("\"abc\""), "abc");
        assert_eq!(normalize_etag("W/\"abc\""), "abc");
        assert_eq!(normalize_etag("abc"), "abc");
    }
}
