//! Where printed reports go: stdout, or the file of `-o`.

use std::{fs::File, io::Write, path::Path};

use crate::{error::Error, render, report::Report};

pub(super) enum Output {
    Stdout,
    File(File),
}

impl Output {
    pub(super) fn open(path: Option<&Path>) -> Result<Self, Error> {
        Ok(match path {
            None => Self::Stdout,
            Some(p) => Self::File(File::create(p).map_err(|e| {
                Error::Usage(format!("cannot write report file {}: {e}", p.display()))
            })?),
        })
    }

    /// One report, as text or as a line of JSON.
    pub(super) fn write(&mut self, r: &Report, json: bool) -> Result<(), Error> {
        let text = if json {
            render::json_line(r).map_err(|e| anyhow::anyhow!("{e}"))?
        } else {
            render::text(r)
        };
        match self {
            // Piped into a reader that stopped (`| head`): what it read was what it wanted.
            Self::Stdout if crate::say::stdout(&text) => Ok(()),
            Self::Stdout => Err(anyhow::anyhow!("the report could not be written").into()),
            Self::File(f) => f
                .write_all(text.as_bytes())
                .map_err(|e| anyhow::anyhow!("writing the report: {e}").into()),
        }
    }
}
