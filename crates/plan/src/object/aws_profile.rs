//! An S3 store's settings from the AWS shared files (issue 27), as the AWS
//! CLI and SDKs read them: the profile `AWS_PROFILE` names
//! (`AWS_DEFAULT_PROFILE`, else `default`) in the credentials file
//! (`AWS_SHARED_CREDENTIALS_FILE`, else `~/.aws/credentials`: keys and
//! session token) and the config file (`AWS_CONFIG_FILE`, else
//! `~/.aws/config`, where a profile other than `default` is
//! `[profile NAME]`: region, endpoint, and keys where the credentials file
//! has none). The environment's variables come first: the files give only
//! what they leave unset, and no keys when the environment has a key or a
//! web identity (`AWS_WEB_IDENTITY_TOKEN_FILE`) and no profile is named.
//! A profile whose credentials come another way (a role to assume, SSO, a
//! credential process) is an error naming it and the setting, not
//! another identity's keys. (`object_store` reads the environment alone.)
//!
//! The files are INI-like, but a setting may hold indented settings of its
//! own (`s3 =` then `  addressing_style = path`), which no INI reader takes
//! as the AWS tools do: so they are read here, those left out.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// A profile's key settings, named as `object_store` takes them.
const FROM_CREDENTIALS: [&str; 3] = [
    "aws_access_key_id",
    "aws_secret_access_key",
    "aws_session_token",
];

/// A profile's settings for credentials got another way than keys.
const OTHER_CREDENTIALS: [&str; 8] = [
    "role_arn",
    "source_profile",
    "credential_source",
    "credential_process",
    "sso_session",
    "sso_start_url",
    "sso_account_id",
    "web_identity_token_file",
];

/// The options the AWS shared files give an S3 store, beside `env` (the
/// `AWS_*` variables, lowercased as `object_store` takes them). An error
/// names a file that cannot be read, or a profile `AWS_PROFILE` names
/// that neither file has.
pub(crate) fn options(env: &[(String, String)]) -> Result<Vec<(String, String)>> {
    let var = |name: &str| {
        env.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let file = |var_name: &str, default: &str| {
        var(var_name)
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(".aws").join(default)))
    };
    let named = var("AWS_PROFILE").or_else(|| var("AWS_DEFAULT_PROFILE"));
    let profile = named.clone().unwrap_or_else(|| "default".into());
    let credentials_file = file("AWS_SHARED_CREDENTIALS_FILE", "credentials");
    let config_file = file("AWS_CONFIG_FILE", "config");
    let mut credentials = sections(credentials_file.as_deref())?;
    let mut config = sections(config_file.as_deref())?;
    let credentials = credentials.remove(&profile);
    let config = match profile.as_str() {
        "default" => config
            .remove("default")
            .or_else(|| config.remove("profile default")),
        name => config.remove(&format!("profile {name}")),
    };
    if named.is_some() && credentials.is_none() && config.is_none() {
        let files: Vec<String> = [&credentials_file, &config_file]
            .into_iter()
            .flatten()
            .map(|p| p.display().to_string())
            .collect();
        return Err(Error::Invalid(match files.is_empty() {
            true => format!(
                "AWS_PROFILE names profile `{profile}`, and there is no AWS config file (HOME is not set)"
            ),
            false => format!(
                "AWS_PROFILE names profile `{profile}`, which neither {} has",
                files.join(" nor ")
            ),
        }));
    }
    let (credentials, config) = (credentials.unwrap_or_default(), config.unwrap_or_default());
    let mut options = Vec::new();
    // Keys come whole from one place: the environment, else the
    // credentials file, else the config file.
    let env_identity = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
        .iter()
        .any(|v| var(v).is_some())
        || named.is_none() && var("AWS_WEB_IDENTITY_TOKEN_FILE").is_some();
    if !env_identity {
        for settings in [&credentials, &config] {
            if let Some(other) = OTHER_CREDENTIALS
                .iter()
                .find(|k| settings.contains_key(**k))
            {
                return Err(Error::Invalid(format!(
                    "AWS profile `{profile}` gets its credentials by `{other}`, which streambatch does not \
                     follow: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), \
                     for example from `aws configure export-credentials --profile {profile} --format env`"
                )));
            }
        }
        let keys = match credentials.contains_key("aws_access_key_id") {
            true => &credentials,
            false => &config,
        };
        for key in FROM_CREDENTIALS {
            if let Some(value) = keys.get(key) {
                options.push((key.to_string(), value.clone()));
            }
        }
    }
    if var("AWS_REGION").is_none()
        && var("AWS_DEFAULT_REGION").is_none()
        && let Some(region) = config.get("region")
    {
        options.push(("aws_region".into(), region.clone()));
    }
    if var("AWS_ENDPOINT_URL").is_none()
        && var("AWS_ENDPOINT").is_none()
        && let Some(endpoint) = config.get("endpoint_url")
    {
        options.push(("aws_endpoint".into(), endpoint.clone()));
    }
    Ok(options)
}

/// The settings of each section of the file at `path`, by its name; none
/// when there is no such file.
fn sections(path: Option<&Path>) -> Result<HashMap<String, HashMap<String, String>>> {
    let mut sections: HashMap<String, HashMap<String, String>> = HashMap::new();
    let Some(path) = path else {
        return Ok(sections);
    };
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(sections),
        Err(e) => return Err(Error::io("reading", path, e)),
    };
    let mut current = None;
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with(['#', ';']) {
            continue;
        }
        // A header may be followed by a comment: `[dev]  # mine`.
        if let Some(header) = trimmed.strip_prefix('[') {
            let name = header.split(']').next().unwrap_or_default().trim();
            sections.entry(name.to_string()).or_default();
            current = Some(name.to_string());
            continue;
        }
        // An indented line is a nested setting's: left out.
        if line.starts_with([' ', '\t']) {
            continue;
        }
        if let (Some(section), Some((key, value))) = (&current, trimmed.split_once('=')) {
            sections
                .entry(section.clone())
                .or_default()
                .insert(key.trim().to_ascii_lowercase(), value.trim().to_string());
        }
    }
    Ok(sections)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// The two files in `dir` (removed with it), and the variables naming them.
    fn files(dir: &tempfile::TempDir, credentials: &str, config: &str) -> Vec<(String, String)> {
        let dir = dir.path();
        std::fs::write(dir.join("credentials"), credentials).unwrap();
        std::fs::write(dir.join("config"), config).unwrap();
        let file = |name: &str| dir.join(name).display().to_string();
        env(&[
            ("AWS_SHARED_CREDENTIALS_FILE", &file("credentials")),
            ("AWS_CONFIG_FILE", &file("config")),
        ])
    }

    const CREDENTIALS: &str = "\
# keys
[default]
aws_access_key_id = AKDEFAULT
aws_secret_access_key = default-secret

[dev]
aws_access_key_id=AKDEV
aws_secret_access_key=dev-secret
aws_session_token = dev-token
";

    const CONFIG: &str = "\
[default]
region = eu-west-1

[profile dev]
region = us-west-2
s3 =
  addressing_style = path
  endpoint_url = https://nested.invalid
endpoint_url = http://127.0.0.1:9000
";

    fn get<'a>(options: &'a [(String, String)], key: &str) -> Option<&'a str> {
        options
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn the_named_profile_gives_keys_region_and_endpoint() {
        let dir = tempfile::tempdir().unwrap();
        let mut vars = files(&dir, CREDENTIALS, CONFIG);
        let default = options(&vars).unwrap();
        assert_eq!(get(&default, "aws_access_key_id"), Some("AKDEFAULT"));
        assert_eq!(get(&default, "aws_region"), Some("eu-west-1"));
        assert_eq!(get(&default, "aws_session_token"), None);
        assert_eq!(get(&default, "aws_endpoint"), None);
        vars.extend(env(&[("AWS_PROFILE", "dev")]));
        let dev = options(&vars).unwrap();
        assert_eq!(get(&dev, "aws_access_key_id"), Some("AKDEV"));
        assert_eq!(get(&dev, "aws_secret_access_key"), Some("dev-secret"));
        assert_eq!(get(&dev, "aws_session_token"), Some("dev-token"));
        assert_eq!(get(&dev, "aws_region"), Some("us-west-2"));
        // The nested `s3` settings are not the profile's.
        assert_eq!(get(&dev, "aws_endpoint"), Some("http://127.0.0.1:9000"));
    }

    #[test]
    fn the_environment_comes_first() {
        let dir = tempfile::tempdir().unwrap();
        let mut vars = files(&dir, CREDENTIALS, CONFIG);
        vars.extend(env(&[
            ("AWS_PROFILE", "dev"),
            ("AWS_ACCESS_KEY_ID", "AKENV"),
            ("AWS_REGION", "ap-south-1"),
            ("AWS_ENDPOINT_URL", "http://env.invalid"),
        ]));
        // Nothing from the files: no key of theirs beside the
        // environment's (a secret of one with the key of the other).
        assert_eq!(options(&vars).unwrap(), vec![]);
    }

    #[test]
    fn keys_in_the_config_file_count_absent_files_give_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let config = "[default]\naws_access_key_id = AKCONF\naws_secret_access_key = s\n";
        let vars = files(&dir, "", config);
        let found = options(&vars).unwrap();
        assert_eq!(get(&found, "aws_access_key_id"), Some("AKCONF"));
        let missing = env(&[
            ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials"),
            ("AWS_CONFIG_FILE", "/nonexistent/config"),
        ]);
        assert_eq!(options(&missing).unwrap(), vec![]);
    }

    #[test]
    fn a_header_may_carry_a_comment_and_default_may_be_named_as_a_profile() {
        let dir = tempfile::tempdir().unwrap();
        let credentials = "[dev]  # mine\naws_access_key_id = AKDEV\naws_secret_access_key = d\n\
                           [default] ; shared\naws_access_key_id = AKDEFAULT\naws_secret_access_key = s\n";
        let config = "[profile default]\nregion = sa-east-1\n";
        let mut vars = files(&dir, credentials, config);
        let found = options(&vars).unwrap();
        assert_eq!(get(&found, "aws_access_key_id"), Some("AKDEFAULT"));
        assert_eq!(get(&found, "aws_region"), Some("sa-east-1"));
        vars.extend(env(&[("AWS_DEFAULT_PROFILE", "dev")]));
        assert_eq!(
            get(&options(&vars).unwrap(), "aws_access_key_id"),
            Some("AKDEV")
        );
    }

    #[test]
    fn credentials_got_another_way_are_named_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let config = "[profile ops]\nrole_arn = arn:aws:iam::1:role/x\nsource_profile = default\n";
        let mut vars = files(&dir, CREDENTIALS, config);
        vars.extend(env(&[("AWS_PROFILE", "ops")]));
        let e = options(&vars).unwrap_err().to_string();
        assert!(e.contains("`ops`") && e.contains("`role_arn`"), "{e}");
        // The environment's keys come first: the profile's way is moot.
        vars.extend(env(&[
            ("AWS_ACCESS_KEY_ID", "AKENV"),
            ("AWS_SECRET_ACCESS_KEY", "s"),
        ]));
        assert_eq!(options(&vars).unwrap(), vec![]);
        // A web identity in the environment (a pod's), no profile named:
        // no keys from the default profile beside it.
        let mut pod = files(&dir, CREDENTIALS, CONFIG);
        pod.extend(env(&[("AWS_WEB_IDENTITY_TOKEN_FILE", "/var/run/token")]));
        let found = options(&pod).unwrap();
        assert_eq!(get(&found, "aws_access_key_id"), None);
        assert_eq!(get(&found, "aws_region"), Some("eu-west-1"));
    }

    #[test]
    fn a_named_profile_neither_file_has_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut vars = files(&dir, CREDENTIALS, CONFIG);
        vars.extend(env(&[("AWS_PROFILE", "prod")]));
        let e = options(&vars).unwrap_err().to_string();
        assert!(e.contains("`prod`") && e.contains("credentials"), "{e}");
    }
}
