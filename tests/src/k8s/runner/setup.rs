//! What the runner prepares before a container starts: its environment, its volumes and the
//! kubeconfig holding its service account's token.

use super::*;

impl PodWorker {
    pub(super) async fn resolve_env(
        &self,
        container: &Container,
        ip: &str,
    ) -> Result<Vec<(String, String)>> {
        let mut out: Vec<(String, String)> = Vec::new();
        for from in container.env_from.iter().flatten() {
            let prefix = from.prefix.clone().unwrap_or_default();
            if let Some(r) = &from.secret_ref {
                let data = self
                    .secret_data(&r.name, r.optional.unwrap_or(false))
                    .await?;
                out.extend(data.into_iter().map(|(k, v)| (format!("{prefix}{k}"), v)));
            }
            if let Some(r) = &from.config_map_ref {
                let data = self
                    .config_map_data(&r.name, r.optional.unwrap_or(false))
                    .await?;
                out.extend(data.into_iter().map(|(k, v)| (format!("{prefix}{k}"), v)));
            }
        }
        for EnvVar {
            name,
            value,
            value_from,
        } in container.env.iter().flatten()
        {
            let resolved = if let Some(v) = value {
                let lookup: HashMap<&str, &str> =
                    out.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                Some(expand(v, &lookup))
            } else if let Some(src) = value_from {
                if let Some(r) = &src.secret_key_ref {
                    let data = self
                        .secret_data(&r.name, r.optional.unwrap_or(false))
                        .await?;
                    match data.get(&r.key) {
                        Some(v) => Some(v.clone()),
                        None if r.optional.unwrap_or(false) => None,
                        None => bail!(
                            "couldn't find key {} in Secret {}/{}",
                            r.key,
                            self.namespace,
                            r.name
                        ),
                    }
                } else if let Some(r) = &src.config_map_key_ref {
                    let data = self
                        .config_map_data(&r.name, r.optional.unwrap_or(false))
                        .await?;
                    match data.get(&r.key) {
                        Some(v) => Some(v.clone()),
                        None if r.optional.unwrap_or(false) => None,
                        None => bail!(
                            "couldn't find key {} in ConfigMap {}/{}",
                            r.key,
                            self.namespace,
                            r.name
                        ),
                    }
                } else if let Some(f) = &src.field_ref {
                    Some(self.field(&f.field_path, ip)?)
                } else {
                    src.resource_field_ref
                        .as_ref()
                        .map(|r| self.resource_field(container, &r.resource))
                }
            } else {
                Some(String::new())
            };
            if let Some(v) = resolved {
                out.retain(|(k, _)| k != name);
                out.push((name.clone(), v));
            }
        }
        Ok(out)
    }

    pub(super) fn field(&self, path: &str, ip: &str) -> Result<String> {
        let m = &self.pod.metadata;
        let spec = self.pod.spec.as_ref();
        let keyed = |prefix: &str, map: &Option<BTreeMap<String, String>>| -> Option<String> {
            let key = path.strip_prefix(prefix)?.strip_suffix("']")?;
            Some(map.as_ref()?.get(key).cloned().unwrap_or_default())
        };
        Ok(match path {
            "metadata.name" => self.name.clone(),
            "metadata.namespace" => self.namespace.clone(),
            "metadata.uid" => m.uid.clone().unwrap_or_default(),
            "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
            "spec.serviceAccountName" => spec
                .and_then(|s| s.service_account_name.clone())
                .unwrap_or_default(),
            "status.podIP" | "status.podIPs" => ip.to_string(),
            "status.hostIP" | "status.hostIPs" => "127.0.0.1".into(),
            _ => keyed("metadata.labels['", &m.labels)
                .or_else(|| keyed("metadata.annotations['", &m.annotations))
                .ok_or_else(|| anyhow!("unsupported fieldRef {path}"))?,
        })
    }

    fn resource_field(&self, container: &Container, resource: &str) -> String {
        let (kind, name) = resource.split_once('.').unwrap_or(("limits", resource));
        let res = container.resources.as_ref();
        let list = match kind {
            "requests" => res.and_then(|r| r.requests.as_ref()),
            _ => res.and_then(|r| r.limits.as_ref()),
        };
        list.and_then(|l| l.get(name))
            .map(|q| q.0.clone())
            .unwrap_or_else(|| "0".into())
    }

    async fn secret_data(&self, name: &str, optional: bool) -> Result<BTreeMap<String, String>> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        match api.get_opt(name).await? {
            Some(s) => {
                let mut out: BTreeMap<String, String> = s
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                    .collect();
                out.extend(s.string_data.unwrap_or_default());
                Ok(out)
            }
            None if optional => Ok(BTreeMap::new()),
            None => bail!("secret \"{name}\" not found"),
        }
    }

    async fn config_map_data(
        &self,
        name: &str,
        optional: bool,
    ) -> Result<BTreeMap<String, String>> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        match api.get_opt(name).await? {
            Some(c) => Ok(c.data.unwrap_or_default()),
            None if optional => Ok(BTreeMap::new()),
            None => bail!("configmap \"{name}\" not found"),
        }
    }

    /// Writes each mounted Secret, ConfigMap, downward API or emptyDir volume under the pod
    /// folder, and finds the host folder of each claim; returns mount path → local folder.
    pub(super) async fn write_volumes(
        &self,
        container: &Container,
    ) -> Result<Vec<(String, PathBuf)>> {
        let volumes = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.clone())
            .unwrap_or_default();
        let mut out = Vec::new();
        for mount in container.volume_mounts.iter().flatten() {
            // /dev/shm exists on the host: an emptyDir there is the host's.
            if mount.mount_path == "/dev/shm" {
                continue;
            }
            let Some(volume) = volumes.iter().find(|v| v.name == mount.name) else {
                bail!(
                    "volume {} of mount {} not found",
                    mount.name,
                    mount.mount_path
                );
            };
            if let Some(claim) = &volume.persistent_volume_claim {
                let host = self.claim_host_path(&claim.claim_name).await?;
                let local = match &mount.sub_path {
                    Some(sub) if !sub.is_empty() => host.join(sub),
                    _ => host,
                };
                out.push((mount.mount_path.clone(), local));
                continue;
            }
            let dir = self.dir.join("volumes").join(&volume.name);
            tokio::fs::create_dir_all(&dir).await?;
            let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
            if let Some(s) = &volume.secret {
                let name = s.secret_name.clone().unwrap_or_default();
                let data = self.secret_data(&name, s.optional.unwrap_or(false)).await?;
                files.extend(data.into_iter().map(|(k, v)| (k, v.into_bytes())));
            } else if let Some(c) = &volume.config_map {
                let data = self
                    .config_map_data(&c.name, c.optional.unwrap_or(false))
                    .await?;
                files.extend(data.into_iter().map(|(k, v)| (k, v.into_bytes())));
            } else if let Some(d) = &volume.downward_api {
                let ip = self.ip.map(|i| i.to_string()).unwrap_or_default();
                for item in d.items.iter().flatten() {
                    if let Some(f) = &item.field_ref {
                        files.insert(
                            item.path.clone(),
                            self.field(&f.field_path, &ip)?.into_bytes(),
                        );
                    }
                }
            } else if volume.empty_dir.is_none() {
                // Host paths, projected tokens: nothing to provide locally.
                continue;
            }
            for (key, bytes) in files {
                let path = dir.join(&key);
                if let Some(parent) = path.parent() {
                    tokio::fs::create_dir_all(parent).await?;
                }
                tokio::fs::write(&path, bytes).await?;
            }
            let local = match &mount.sub_path {
                Some(sub) if !sub.is_empty() => dir.join(sub),
                _ => dir,
            };
            out.push((mount.mount_path.clone(), local));
        }
        Ok(out)
    }

    /// The folder of a claim bound to a `hostPath` PersistentVolume (what the kubelet mounts
    /// for it), created when missing.
    async fn claim_host_path(&self, claim: &str) -> Result<PathBuf> {
        let claims: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), &self.namespace);
        let pvc = claims
            .get_opt(claim)
            .await?
            .ok_or_else(|| anyhow!("persistentvolumeclaim \"{claim}\" not found"))?;
        let volume = pvc
            .spec
            .and_then(|s| s.volume_name)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| anyhow!("persistentvolumeclaim \"{claim}\" is not bound"))?;
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let path = pvs
            .get(&volume)
            .await?
            .spec
            .and_then(|s| s.host_path)
            .map(|h| PathBuf::from(h.path))
            .ok_or_else(|| {
                anyhow!("persistentvolume {volume} of claim {claim} is not a hostPath volume")
            })?;
        tokio::fs::create_dir_all(&path).await?;
        Ok(path)
    }

    /// A kubeconfig with a bound token of the pod's service account, unless the pod opts out.
    pub(super) async fn write_kubeconfig(&self) -> Result<Option<PathBuf>> {
        let spec = self.pod.spec.as_ref();
        if spec.and_then(|s| s.automount_service_account_token) == Some(false) {
            return Ok(None);
        }
        let sa = spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into());
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), &self.namespace);
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                expiration_seconds: Some(24 * 3600),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(self.name.clone()),
                    uid: self.pod.uid(),
                }),
                ..TokenRequestSpec::default()
            }),
            ..TokenRequest::default()
        };
        let token = api
            .create_token_request(&sa, &PostParams::default(), &request)
            .await
            .with_context(|| format!("token for service account {}/{sa}", self.namespace))?
            .status
            .and_then(|s| s.token)
            .ok_or_else(|| anyhow!("the token request returned no token"))?;
        let path = self.dir.join("kubeconfig");
        let yaml = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority: {}\nusers:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u, namespace: {}}}\ncurrent-context: c\n",
            self.config.server,
            self.config.ca_file.display(),
            self.namespace
        );
        tokio::fs::write(&path, yaml).await?;
        Ok(Some(path))
    }
}

/// `$(VAR)` expansion as the kubelet does it: known names are replaced, `$$` escapes,
/// unknown references stay as written.
pub fn expand(s: &str, vars: &HashMap<&str, &str>) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
            && let Some(value) = vars.get(&inner[..end])
        {
            out.push_str(value);
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// Rewrites a value that is, or contains after `=`, a path under a mapped prefix.
pub fn rewrite_paths(v: &str, map: &[(String, PathBuf)]) -> String {
    let rewrite = |p: &str| -> Option<String> {
        map.iter().find_map(|(prefix, local)| {
            let prefix = prefix.trim_end_matches('/');
            let rest = p.strip_prefix(prefix)?;
            (rest.is_empty() || rest.starts_with('/')).then(|| format!("{}{rest}", local.display()))
        })
    };
    if let Some(r) = rewrite(v) {
        return r;
    }
    if let Some((k, p)) = v.split_once('=')
        && let Some(r) = rewrite(p)
    {
        return format!("{k}={r}");
    }
    v.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expansion_follows_the_kubelet() {
        let vars = HashMap::from([("KEY", "s3cret"), ("IP", "127.1.0.9")]);
        assert_eq!(expand("--api-key=$(KEY)", &vars), "--api-key=s3cret");
        assert_eq!(expand("$(IP):$(MISSING)", &vars), "127.1.0.9:$(MISSING)");
        assert_eq!(expand("$$(KEY) $", &vars), "$(KEY) $");
    }

    #[test]
    fn paths_under_a_mapped_prefix_are_rewritten() {
        let map = vec![("/models".to_string(), PathBuf::from("/cache/m"))];
        assert_eq!(rewrite_paths("/models/a.gguf", &map), "/cache/m/a.gguf");
        assert_eq!(
            rewrite_paths("--model=/models/a", &map),
            "--model=/cache/m/a"
        );
        assert_eq!(rewrite_paths("/modelsx/a", &map), "/modelsx/a");
        assert_eq!(rewrite_paths("plain", &map), "plain");
    }
}
