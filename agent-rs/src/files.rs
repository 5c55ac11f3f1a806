//! write/read/list/stat, with the reply shapes and errors of PROTOCOL.md. Each is bounded (the manager moves
//! files in chunks of at most 1 MiB; files open non-blocking, so a FIFO cannot hang us).

use crate::json::{obj, s, Value};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};

use crate::sys::{strerror, O_NONBLOCK};

/// Why a request failed: an OS error (errno, and the file it names), one whose text is not strerror's, or
/// anything else ("Type: message"). See PROTOCOL.md, "Errors".
pub enum Failure {
    Os { errno: i32, filename: Option<String> },
    OsText { errno: i32, message: String },
    Internal(String),
}

impl Failure {
    pub fn os(err: &io::Error, filename: &str) -> Failure {
        match err.raw_os_error() {
            Some(errno) => Failure::Os { errno, filename: Some(filename.to_string()) },
            None => Failure::Internal(format!("OSError: {}", err)),
        }
    }
    pub fn errno(errno: i32, filename: &str) -> Failure {
        Failure::Os { errno, filename: Some(filename.to_string()) }
    }
    pub fn message(&self) -> String {
        match self {
            Failure::Os { errno, filename: Some(name) } => format!("{}: {}", strerror(*errno), name),
            Failure::Os { errno, filename: None } => strerror(*errno),
            Failure::OsText { message, .. } | Failure::Internal(message) => message.clone(),
        }
    }
    pub fn reply(&self, rid: &Value) -> Value {
        match self {
            Failure::Os { errno, .. } | Failure::OsText { errno, .. } => obj(vec![
                ("id", rid.clone()),
                ("ev", s("error")),
                ("kind", s("os")),
                ("errno", Value::Int(*errno as i64)),
                ("message", s(&self.message())),
            ]),
            Failure::Internal(message) => obj(vec![
                ("id", rid.clone()),
                ("ev", s("error")),
                ("kind", s("internal")),
                ("message", s(message)),
            ]),
        }
    }
}

pub fn field<'a>(header: &'a Value, key: &str) -> Result<&'a Value, Failure> {
    header.get(key).ok_or_else(|| Failure::Internal(format!("KeyError: '{}'", key)))
}

pub fn str_field<'a>(header: &'a Value, key: &str) -> Result<&'a str, Failure> {
    field(header, key)?
        .as_str()
        .ok_or_else(|| Failure::Internal(format!("TypeError: {} must be a string", key)))
}

pub fn int_field(header: &Value, key: &str) -> Result<i64, Failure> {
    field(header, key)?
        .as_i64()
        .ok_or_else(|| Failure::Internal(format!("TypeError: {} must be an integer", key)))
}

fn mtime(meta: &fs::Metadata) -> f64 {
    meta.mtime() as f64 + meta.mtime_nsec() as f64 * 1e-9
}

fn basename(path: &str) -> String {
    let trimmed = path.trim_end_matches('/');
    let name = trimmed.rsplit('/').next().unwrap_or("");
    if name.is_empty() { "/".to_string() } else { name.to_string() }
}

pub fn file_info(path: &str) -> Result<Value, Failure> {
    let meta = fs::symlink_metadata(path).map_err(|e| Failure::os(&e, path))?;
    let kind = meta.file_type();
    let kind = if kind.is_dir() {
        "directory"
    } else if kind.is_symlink() {
        "symlink"
    } else if kind.is_file() {
        "file"
    } else {
        "other"
    };
    Ok(obj(vec![
        ("name", s(&basename(path))),
        ("path", s(path)),
        ("type", s(kind)),
        ("size", Value::Int(meta.size() as i64)),
        ("mode", Value::Int((meta.mode() & 0o7777) as i64)),
        ("mtime", Value::Float(mtime(&meta))),
    ]))
}

pub fn list_dir(path: &str) -> Result<Vec<(&'static str, Value)>, Failure> {
    let mut names: Vec<String> = Vec::new();
    for entry in fs::read_dir(path).map_err(|e| Failure::os(&e, path))? {
        let entry = entry.map_err(|e| Failure::os(&e, path))?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    let mut files = Vec::with_capacity(names.len());
    for name in names {
        let full = if path.ends_with('/') || path.is_empty() { format!("{}{}", path, name) } else { format!("{}/{}", path, name) };
        files.push(file_info(&full)?);
    }
    Ok(vec![("files", Value::Arr(files))])
}

fn dirname(path: &str) -> &str {
    match path.rfind('/') {
        Some(at) => {
            let head = &path[..at + 1];
            let trimmed = head.trim_end_matches('/');
            if trimmed.is_empty() { head } else { trimmed }
        }
        None => "",
    }
}

/// Append one chunk of an upload to a temp file; the last chunk renames it into place, abort removes it.
pub fn write_part(header: &Value, body: &[u8]) -> Result<Vec<(&'static str, Value)>, Failure> {
    let path = str_field(header, "path")?;
    let upload = match field(header, "upload")? {
        Value::Str(text) => text.clone(),
        other => other.dumps(),
    };
    let temp = format!("{}.orchard-upload-{}", path, upload);
    if header.get("abort").map_or(false, Value::truthy) {
        let _ = fs::remove_file(&temp);
        return Ok(vec![("size", Value::Int(0))]);
    }
    let offset = int_field(header, "offset")?;
    let mut options = OpenOptions::new();
    options.write(true).mode(0o600).custom_flags(O_NONBLOCK);
    if offset == 0 {
        let parent = match dirname(path) { "" => ".", dir => dir };
        fs::create_dir_all(parent).map_err(|e| Failure::os(&e, parent))?;
        options.create(true).truncate(true);
    } else {
        options.append(true);
    }
    let mut file: File = options.open(&temp).map_err(|e| Failure::os(&e, &temp))?;
    file.write_all(body).map_err(|e| Failure::os(&e, &temp))?;
    let size = file.metadata().map_err(|e| Failure::os(&e, &temp))?.len() as i64;
    drop(file);
    let expected = offset + body.len() as i64;
    if size != expected {
        let _ = fs::remove_file(&temp);
        return Err(Failure::Internal(format!(
            "ValueError: upload of {} lost its place (have {} bytes, expected {}); start it again",
            path, size, expected
        )));
    }
    if header.get("last").map_or(false, Value::truthy) {
        let mode = header.get("mode").filter(|v| v.truthy()).and_then(|v| v.as_i64()).unwrap_or(0o644);
        let result = fs::set_permissions(&temp, fs::Permissions::from_mode(mode as u32))
            .and_then(|_| fs::rename(&temp, path));
        if let Err(err) = result {
            let _ = fs::remove_file(&temp);
            return Err(Failure::os(&err, path));
        }
    }
    Ok(vec![("size", Value::Int(size))])
}

/// Up to length bytes of a file from offset, with its size, mode and mtime.
pub fn read_part(header: &Value) -> Result<(Vec<(&'static str, Value)>, Vec<u8>), Failure> {
    let path = str_field(header, "path")?;
    let mut offset = int_field(header, "offset")?.max(0) as u64;
    let mut left = int_field(header, "length")?.max(0) as usize;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(O_NONBLOCK)
        .open(path)
        .map_err(|e| Failure::os(&e, path))?;
    let meta = file.metadata().map_err(|e| Failure::os(&e, path))?;
    if meta.is_dir() {
        return Err(Failure::errno(21, path)); // EISDIR
    }
    if !meta.is_file() {
        // ENODEV: /dev/zero would stream forever, a FIFO block a reader
        return Err(Failure::OsText { errno: 19, message: format!("not a regular file: {}", path) });
    }
    let mut data = Vec::new();
    let mut chunk = vec![0u8; left.min(1 << 20)];
    while left > 0 {
        let want = left.min(chunk.len());
        match file.read_at(&mut chunk[..want], offset) {
            Ok(0) => break,
            Ok(n) => {
                data.extend_from_slice(&chunk[..n]);
                offset += n as u64;
                left -= n;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Failure::os(&e, "").without_name()),
        }
    }
    let head = vec![
        ("size", Value::Int(meta.size() as i64)),
        ("mode", Value::Int((meta.mode() & 0o7777) as i64)),
        ("mtime", Value::Float(mtime(&meta))),
    ];
    Ok((head, data))
}

impl Failure {
    /// The same error without the file it names (errors of calls on an open fd name none).
    pub fn without_name(self) -> Failure {
        match self {
            Failure::Os { errno, .. } => Failure::Os { errno, filename: None },
            other => other,
        }
    }
}
