//! A YAML document as a tree of nodes that remember their `line:col`, so the
//! YAML front end can point every error at the offending key or value.

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

use urutau_planner::diagnostic::{Diagnostic, Span};

/// A YAML value.
#[derive(Debug, Clone)]
pub enum Value {
    Scalar(String, TScalarStyle),
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
}

/// A YAML value and where it starts.
#[derive(Debug, Clone)]
pub struct Node {
    pub value: Value,
    pub span: Span,
}

impl Node {
    /// The text of a scalar (`None` for sequences and mappings).
    pub fn as_str(&self) -> Option<&str> {
        match &self.value {
            Value::Scalar(s, _) => Some(s),
            _ => None,
        }
    }

    /// The entries of a mapping, or an error naming what was expected.
    pub fn as_map(&self, what: &str) -> Result<&[(Node, Node)], Diagnostic> {
        match &self.value {
            Value::Map(m) => Ok(m),
            _ => Err(Diagnostic::error(
                self.span,
                format!("{what} must be a mapping"),
            )),
        }
    }

    /// The items of a sequence.
    pub fn as_seq(&self, what: &str) -> Result<&[Node], Diagnostic> {
        match &self.value {
            Value::Seq(s) => Ok(s),
            _ => Err(Diagnostic::error(
                self.span,
                format!("{what} must be a list"),
            )),
        }
    }

    /// Where a scalar's text starts: one column right of a quote.
    pub fn text_span(&self) -> Span {
        match &self.value {
            Value::Scalar(_, TScalarStyle::SingleQuoted | TScalarStyle::DoubleQuoted) => {
                self.span.shifted(1)
            }
            _ => self.span,
        }
    }
}

struct Builder {
    stack: Vec<(Node, Option<Node>)>,
    root: Option<Node>,
}

fn span(mark: Marker) -> Span {
    // yaml-rust2 counts lines from 1 and columns from 0.
    Span::new(mark.line() as u32, mark.col() as u32 + 1)
}

impl Builder {
    fn push_value(&mut self, node: Node) {
        match self.stack.last_mut() {
            None => self.root = Some(node),
            Some((parent, pending_key)) => match &mut parent.value {
                Value::Seq(items) => items.push(node),
                Value::Map(entries) => match pending_key.take() {
                    None => *pending_key = Some(node),
                    Some(key) => entries.push((key, node)),
                },
                Value::Scalar(..) => unreachable!("scalars have no children"),
            },
        }
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        match ev {
            Event::Scalar(text, style, _, _) => self.push_value(Node {
                value: Value::Scalar(text, style),
                span: span(mark),
            }),
            Event::SequenceStart(..) => self.stack.push((
                Node {
                    value: Value::Seq(vec![]),
                    span: span(mark),
                },
                None,
            )),
            Event::MappingStart(..) => self.stack.push((
                Node {
                    value: Value::Map(vec![]),
                    span: span(mark),
                },
                None,
            )),
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some((node, _)) = self.stack.pop() {
                    self.push_value(node);
                }
            }
            _ => {}
        }
    }
}

/// Parses one YAML document into a tree.
pub fn parse(text: &str) -> Result<Node, Diagnostic> {
    let mut builder = Builder {
        stack: vec![],
        root: None,
    };
    let mut parser = Parser::new_from_str(text);
    parser.load(&mut builder, false).map_err(|e| {
        let m = e.marker();
        Diagnostic::error(span(*m), format!("invalid YAML: {}", e.info()))
    })?;
    builder
        .root
        .ok_or_else(|| Diagnostic::error(Span::new(1, 1), "the file is empty"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_know_their_positions() {
        let root = parse("a: 1\nb:\n  - x\n  - 'y'\n").unwrap();
        let map = root.as_map("root").unwrap();
        assert_eq!(map[0].0.as_str(), Some("a"));
        assert_eq!((map[0].1.span.line, map[0].1.span.col), (1, 4));
        let seq = map[1].1.as_seq("b").unwrap();
        assert_eq!((seq[1].span.line, seq[1].span.col), (4, 5));
        assert_eq!(seq[1].text_span().col, 6);
    }
}
