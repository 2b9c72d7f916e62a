//! Truth-table text, as the upstream e2e tests print it: a header row `- <pod> <pod> ...`, then
//! one row per client pod whose cells say whether it reaches the column's server pod:
//! `.` allowed, `X` denied.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// A parsed matrix: the pods in header order and the verdict for each (from, to) pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matrix {
    pub pods: Vec<String>,
    pub cells: BTreeMap<(String, String), bool>,
}

impl Matrix {
    /// Parses the text form; every row of the header must be present, once, and complete.
    pub fn parse(text: &str) -> Result<Matrix, String> {
        let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
        let header = lines.next().ok_or("empty matrix")?;
        let mut head = header.split_whitespace();
        if head.next() != Some("-") {
            return Err(format!("matrix header must start with '-': {header:?}"));
        }
        let pods: Vec<String> = head.map(str::to_string).collect();
        if pods.is_empty() {
            return Err("matrix header names no pod".to_string());
        }
        let mut cells = BTreeMap::new();
        let mut rows = 0;
        for line in lines {
            let mut parts = line.split_whitespace();
            let from = parts.next().unwrap_or_default().to_string();
            if !pods.contains(&from) {
                return Err(format!("matrix row {from:?} is not in the header"));
            }
            let values: Vec<&str> = parts.collect();
            if values.len() != pods.len() {
                return Err(format!(
                    "matrix row {from:?} has {} cells, expected {}",
                    values.len(),
                    pods.len()
                ));
            }
            for (to, v) in pods.iter().zip(values) {
                let allowed = match v {
                    "." => true,
                    "X" => false,
                    other => return Err(format!("matrix cell {other:?} is neither '.' nor 'X'")),
                };
                if cells.insert((from.clone(), to.clone()), allowed).is_some() {
                    return Err(format!("matrix row {from:?} appears twice"));
                }
            }
            rows += 1;
        }
        if rows != pods.len() {
            return Err(format!("matrix has {rows} rows for {} pods", pods.len()));
        }
        Ok(Matrix { pods, cells })
    }

    /// A matrix with every pair allowed.
    pub fn all_allowed(pods: &[String]) -> Matrix {
        let mut cells = BTreeMap::new();
        for f in pods {
            for t in pods {
                cells.insert((f.clone(), t.clone()), true);
            }
        }
        Matrix {
            pods: pods.to_vec(),
            cells,
        }
    }

    /// Renders cells through `cell` (given the pair), in the header order.
    pub fn render(&self, cell: impl Fn(&str, &str) -> String) -> String {
        let width = self.pods.iter().map(String::len).max().unwrap_or(1).max(1);
        let mut out = format!("{:<width$}", "-");
        for p in &self.pods {
            let _ = write!(out, " {p:<width$}");
        }
        out.truncate(out.trim_end().len());
        out.push('\n');
        for f in &self.pods {
            let _ = write!(out, "{f:<width$}");
            for t in &self.pods {
                let _ = write!(out, " {:<width$}", cell(f, t));
            }
            out.truncate(out.trim_end().len());
            out.push('\n');
        }
        out
    }

    /// The text form of this matrix.
    pub fn text(&self) -> String {
        self.render(|f, t| mark(self.cells.get(&(f.to_string(), t.to_string())).copied()))
    }
}

/// `.` for allowed, `X` for denied, `?` for a pair with no probe at all.
pub fn mark(v: Option<bool>) -> String {
    match v {
        Some(true) => ".".to_string(),
        Some(false) => "X".to_string(),
        None => "?".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_renders_round_trip() {
        let text = "-   x/a x/b\nx/a .   X\nx/b .   .\n";
        let m = Matrix::parse(text).unwrap();
        assert!(!m.cells[&("x/a".to_string(), "x/b".to_string())]);
        assert_eq!(m.text(), text);
    }

    #[test]
    fn rejects_incomplete_rows() {
        assert!(Matrix::parse("- x/a x/b\nx/a .\nx/b . .\n").is_err());
        assert!(Matrix::parse("- x/a x/b\nx/a . .\n").is_err());
    }
}
