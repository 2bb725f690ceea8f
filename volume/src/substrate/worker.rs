//! Worker processes for the probes that are about other hosts.
//!
//! The parent starts children of the same binary (`kaas substrate-worker
//! <role> ...`), talks to each over its stdin/stdout one line at a time, and
//! every wait is bounded: a child stuck on a hung mount turns into a
//! "cannot tell", never a hung checker. Children are killed on drop.
//!
//! Roles (the argument list after the worker subcommand):
//! * `excl <dir> <id>` — for each line `<round>` on stdin, race an exclusive
//!   create of `<dir>/excl-<round>` and answer `won`, `lost <owner>` or
//!   `error <msg>`. The winner writes its id into the file.
//! * `reader <target> <len>` — print `ready`, then open and read `<target>`
//!   by name in a loop until stdin closes; print one JSON [`ReaderStats`].
//! * `cto <dir>` — lines `read <name> <len> <seed>` / `write <name> <len> <seed>`:
//!   read a file by name and compare, or rewrite it in place and close.
//! * `hold <path>` — open `<path>`, print `held`, keep it open until stdin
//!   closes, then close it, print `released` and exit.
//! * `peer <dir>` — one client of the volume for the cross-mount probes
//!   (usually serving the `--peer` mount): one answer per command line, see
//!   [`super::peer::answer`].

use super::probes::{pattern, verify_pattern, Verdict};
use super::SubstrateError;
use crate::fs::Fs;
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the parent waits for any one answer from a worker.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(30);
/// Upper bound on a reader's loop, whatever the parent does.
const READER_MAX: Duration = Duration::from_secs(60);

/// The program and leading arguments that start a worker, e.g.
/// `current_exe() substrate-worker`.
#[derive(Debug, Clone)]
pub struct WorkerCommand {
    /// Executable.
    pub program: PathBuf,
    /// Arguments before the role.
    pub args: Vec<OsString>,
}

impl WorkerCommand {
    /// `current_exe() <subcommand>`.
    pub fn current_exe(subcommand: &str) -> io::Result<Self> {
        Ok(Self {
            program: std::env::current_exe()?,
            args: vec![subcommand.into()],
        })
    }
}

/// What a reader saw.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ReaderStats {
    /// Complete, consistent reads.
    pub ok: u64,
    /// Opens that found no target.
    pub missing: u64,
    /// Reads that saw a mix of versions or a wrong length.
    pub torn: u64,
    /// Other I/O errors.
    pub errors: u64,
    /// Opens or reads that met ESTALE and were retried by name.
    #[serde(default)]
    pub estale_reopens: u64,
    /// The first anomaly, for the evidence line.
    pub first_anomaly: Option<String>,
}

/// A running worker (parent side).
pub struct Worker {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    role: String,
}

impl Worker {
    /// Start a worker with `role` and its arguments.
    pub fn spawn(cmd: &WorkerCommand, role: &str, args: &[&Path]) -> Result<Self, SubstrateError> {
        let mut c = Command::new(&cmd.program);
        c.args(&cmd.args).arg(role).args(args);
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = c
            .spawn()
            .map_err(|e| SubstrateError::Worker(format!("spawn {}: {e}", cmd.program.display())))?;
        let stdin = child.stdin.take();
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| SubstrateError::Worker("no stdout".into()))?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Self {
            child,
            stdin,
            lines: rx,
            role: role.to_owned(),
        })
    }

    /// Send one line.
    pub fn send(&mut self, line: &str) -> Result<(), SubstrateError> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| SubstrateError::Worker("stdin already closed".into()))?;
        writeln!(stdin, "{line}")
            .and_then(|_| stdin.flush())
            .map_err(|e| SubstrateError::Worker(format!("{} worker: write: {e}", self.role)))
    }

    /// Wait (bounded) for one line.
    pub fn recv(&mut self) -> Result<String, SubstrateError> {
        self.lines.recv_timeout(REPLY_TIMEOUT).map_err(|e| {
            SubstrateError::Worker(format!(
                "{} worker gave no answer within {:?} ({e}); a hung mount?",
                self.role, REPLY_TIMEOUT
            ))
        })
    }

    /// Close stdin (the worker's signal to finish).
    pub fn close_stdin(&mut self) {
        self.stdin.take();
    }

    /// Close stdin, collect the final line, and reap the process.
    pub fn finish(mut self) -> Result<String, SubstrateError> {
        self.close_stdin();
        let line = self.recv()?;
        let deadline = Instant::now() + REPLY_TIMEOUT;
        while Instant::now() < deadline {
            match self.child.try_wait() {
                Ok(Some(_)) => return Ok(line),
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => return Err(SubstrateError::Worker(format!("wait: {e}"))),
            }
        }
        Err(SubstrateError::Worker(format!(
            "{} worker did not exit",
            self.role
        )))
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// Child side: run the role named by `args[0]` with the rest as its
/// arguments, talking over this process's stdin/stdout.
pub fn run_worker(fs: &dyn Fs, args: &[OsString]) -> Result<(), SubstrateError> {
    let role = args
        .first()
        .and_then(|a| a.to_str())
        .ok_or_else(|| SubstrateError::Usage("missing role".into()))?;
    let arg = |i: usize| -> Result<&OsString, SubstrateError> {
        args.get(i)
            .ok_or_else(|| SubstrateError::Usage(format!("{role}: missing argument {i}")))
    };
    let num = |i: usize| -> Result<u64, SubstrateError> {
        arg(i)?
            .to_str()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| SubstrateError::Usage(format!("{role}: argument {i} is not a number")))
    };
    let stdin = io::stdin();
    let mut out = io::stdout();
    match role {
        "excl" => excl(
            fs,
            Path::new(arg(1)?),
            &num(2)?.to_string(),
            stdin.lock(),
            &mut out,
        ),
        "reader" => reader(fs, Path::new(arg(1)?), num(2)? as usize, &mut out),
        "cto" => cto(fs, Path::new(arg(1)?), stdin.lock(), &mut out),
        "hold" => hold(fs, Path::new(arg(1)?), &mut out),
        "peer" => {
            let dir = Path::new(arg(1)?);
            for line in stdin.lock().lines() {
                let Ok(line) = line else { break };
                say(&mut out, &super::peer::answer(fs, dir, &line))?;
            }
            say(&mut out, "bye")
        }
        other => Err(SubstrateError::Usage(format!("unknown role {other}"))),
    }
}

fn say(out: &mut impl Write, line: &str) -> Result<(), SubstrateError> {
    writeln!(out, "{line}")
        .and_then(|_| out.flush())
        .map_err(|e| SubstrateError::Worker(format!("stdout: {e}")))
}

fn excl(
    fs: &dyn Fs,
    dir: &Path,
    id: &str,
    input: impl BufRead,
    out: &mut impl Write,
) -> Result<(), SubstrateError> {
    for line in input.lines() {
        let Ok(round) = line else { break };
        let answer =
            super::probes::excl_attempt(fs, &dir.join(format!("excl-{}", round.trim())), id);
        say(out, &answer)?;
    }
    say(out, "bye")
}

fn reader(
    fs: &dyn Fs,
    target: &Path,
    len: usize,
    out: &mut impl Write,
) -> Result<(), SubstrateError> {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    std::thread::spawn(move || {
        // Stdin closing (or the parent dying) is the stop signal.
        let _ = io::copy(&mut io::stdin().lock(), &mut io::sink());
        s.store(true, Ordering::Relaxed);
    });
    say(out, "ready")?;
    let mut st = ReaderStats::default();
    let mut buf = vec![0u8; len + 1];
    let deadline = Instant::now() + READER_MAX;
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        // ESTALE means the name was renamed over under us: reopen by name,
        // as the broker does (DESIGN.md section 11). Not an anomaly.
        let mut res = read_whole(fs, target, &mut buf);
        for _ in 0..3 {
            match &res {
                Err(e) if e.raw_os_error() == Some(libc::ESTALE) => {
                    st.estale_reopens += 1;
                    res = read_whole(fs, target, &mut buf);
                }
                _ => break,
            }
        }
        match res {
            Ok(n) => match verify_pattern(&buf[..n], len) {
                Verdict::Ok(_) => st.ok += 1,
                Verdict::Torn(why) => {
                    st.torn += 1;
                    st.first_anomaly.get_or_insert(why);
                }
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                st.missing += 1;
                st.first_anomaly
                    .get_or_insert_with(|| "target missing (ENOENT) mid-rename".into());
            }
            Err(e) => {
                st.errors += 1;
                st.first_anomaly
                    .get_or_insert_with(|| format!("read error: {e}"));
            }
        }
    }
    let json = serde_json::to_string(&st).map_err(|e| SubstrateError::Worker(e.to_string()))?;
    say(out, &json)
}

/// Open by name and read until EOF (at most `buf.len()` bytes).
fn read_whole(fs: &dyn Fs, path: &Path, buf: &mut [u8]) -> io::Result<usize> {
    let f = fs.open_read(path)?;
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], n as u64)? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

fn cto(
    fs: &dyn Fs,
    dir: &Path,
    input: impl BufRead,
    out: &mut impl Write,
) -> Result<(), SubstrateError> {
    for line in input.lines() {
        let Ok(line) = line else { break };
        let parts: Vec<&str> = line.split_whitespace().collect();
        let answer = match parts.as_slice() {
            [op, name, len, seed] => {
                let (Ok(len), Ok(seed)) = (len.parse::<usize>(), seed.parse::<u64>()) else {
                    say(out, "error bad command")?;
                    continue;
                };
                let path = dir.join(name);
                if *op == "read" {
                    let mut buf = vec![0u8; len + 1];
                    match read_whole(fs, &path, &mut buf) {
                        Ok(n) => match verify_pattern(&buf[..n], len) {
                            Verdict::Ok(s) if s == seed => "ok".to_owned(),
                            Verdict::Ok(s) => format!("stale saw version {s}, expected {seed}"),
                            Verdict::Torn(why) => format!("torn {why}"),
                        },
                        Err(e) => format!("error {e}"),
                    }
                } else {
                    match super::probes::rewrite_in_place(fs, &path, &pattern(seed, len)) {
                        Ok(()) => "done".to_owned(),
                        Err(e) => format!("error {e}"),
                    }
                }
            }
            _ => "error bad command".to_owned(),
        };
        say(out, &answer)?;
    }
    say(out, "bye")
}

fn hold(fs: &dyn Fs, path: &Path, out: &mut impl Write) -> Result<(), SubstrateError> {
    let f = fs
        .open_read(path)
        .map_err(SubstrateError::io("open file to hold", path))?;
    say(out, "held")?;
    let _ = io::copy(&mut io::stdin().lock(), &mut io::sink());
    drop(f);
    say(out, "released")
}
