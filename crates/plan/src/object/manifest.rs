//! The manifest that commits a write to an object store folder (object
//! stores have no rename, so a write cannot appear at once as a local one
//! does): `_streambatch-manifest.<extension>.json` lists the part files of
//! the last write in that format. Readers here honour it: a `part-*` file
//! of that format in the folder that it does not list (a write's being
//! committed, or an earlier write's not yet removed) is not read. The
//! leading `_` hides the manifest from readers that do not know it, as
//! Spark's `_SUCCESS` is.

use bytes::Bytes;

use crate::error::{Error, Result};

/// The manifest of a write's `extension` files in a folder.
pub(crate) fn name(extension: &str) -> String {
    format!("_streambatch-manifest.{extension}.json")
}

/// The extension a manifest's file name is for, when it is one.
fn extension_of(name: &str) -> Option<&str> {
    name.strip_prefix("_streambatch-manifest.")?
        .strip_suffix(".json")
}

/// Whether `key`'s last part names a write manifest.
pub(crate) fn is_manifest(key: &str) -> bool {
    let name = key.rsplit_once('/').map_or(key, |(_, name)| name);
    extension_of(name).is_some()
}

/// Whether `name` is a write's part file with `extension`.
pub(crate) fn is_part(name: &str, extension: &str) -> bool {
    name.starts_with("part-")
        && name
            .strip_suffix(extension)
            .is_some_and(|n| n.ends_with('.'))
}

/// One committed write: its id and its part files' names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Manifest {
    pub(crate) write: String,
    pub(crate) files: Vec<String>,
}

impl Manifest {
    pub(crate) fn to_json(&self) -> Vec<u8> {
        let json = serde_json::json!({ "write": self.write, "files": self.files });
        json.to_string().into_bytes()
    }

    /// Reads a manifest's bytes (hostile: they come from a bucket); an
    /// error names `url`.
    pub(crate) fn parse(bytes: &[u8], url: &str) -> Result<Self> {
        let bad = |why: &str| Error::Invalid(format!("write manifest {url}: {why}"));
        let json: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| bad(&e.to_string()))?;
        let write = json["write"].as_str().ok_or_else(|| bad("no `write` id"))?;
        let files = json["files"]
            .as_array()
            .ok_or_else(|| bad("no `files` list"))?
            .iter()
            .map(|f| match f.as_str() {
                Some(name) if !name.contains('/') && !name.is_empty() => Ok(name.to_string()),
                _ => Err(bad("a file that is not a name in its folder")),
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            write: write.to_string(),
            files,
        })
    }
}

/// `keys` less the parts that a manifest among them does not list in its
/// folder; `read` fetches a manifest by its key.
pub(crate) fn honour(
    keys: Vec<String>,
    read: impl Fn(&str) -> Result<Bytes>,
) -> Result<Vec<String>> {
    let split = |key: &str| match key.rsplit_once('/') {
        Some((folder, name)) => (folder.to_string(), name.to_string()),
        None => (String::new(), key.to_string()),
    };
    // (folder, extension) -> the names its manifest lists.
    let mut listed = std::collections::HashMap::new();
    for key in &keys {
        let (folder, name) = split(key);
        if let Some(extension) = extension_of(&name) {
            let bytes = read(key)?;
            let manifest = Manifest::parse(&bytes, key)?;
            listed.insert((folder, extension.to_string()), manifest.files);
        }
    }
    if listed.is_empty() {
        return Ok(keys);
    }
    Ok(keys
        .into_iter()
        .filter(|key| {
            let (folder, name) = split(key);
            !listed.iter().any(|((f, extension), files)| {
                *f == folder && is_part(&name, extension) && !files.contains(&name)
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_a_manifest_does_not_list_are_left_out_of_its_folder_only() {
        let manifest = Manifest {
            write: "w2".into(),
            files: vec!["part-000001-w2.parquet".into()],
        };
        let keys: Vec<String> = [
            "out/_streambatch-manifest.parquet.json",
            "out/part-000001-w2.parquet",
            "out/part-000001-w1.parquet",
            "out/part-000001-w1.csv",
            "out/notes.parquet",
            "other/part-000009.parquet",
        ]
        .map(String::from)
        .to_vec();
        let read = |key: &str| {
            assert_eq!(key, "out/_streambatch-manifest.parquet.json");
            Ok(Bytes::from(manifest.to_json()))
        };
        let kept = honour(keys, read).unwrap();
        assert_eq!(
            kept,
            [
                "out/_streambatch-manifest.parquet.json",
                "out/part-000001-w2.parquet",
                "out/part-000001-w1.csv",
                "out/notes.parquet",
                "other/part-000009.parquet",
            ]
        );
    }

    #[test]
    fn a_manifest_naming_a_path_or_lacking_fields_is_refused() {
        let url = "s3://b/out/_streambatch-manifest.csv.json";
        for bad in [
            &br#"{"write":"w","files":["../x.csv"]}"#[..],
            br#"{"write":"w","files":["a/b.csv"]}"#,
            br#"{"files":[]}"#,
            b"not json",
        ] {
            let e = Manifest::parse(bad, url).unwrap_err().to_string();
            assert!(e.contains(url), "{e}");
        }
        let ok = Manifest::parse(br#"{"write":"w","files":["part-1.csv"]}"#, url).unwrap();
        assert_eq!(ok.files, ["part-1.csv"]);
    }
}
