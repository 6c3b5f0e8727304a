//! `<Kind>SourceExec`: the leaf of a route, reading the route's share of
//! the source's change batches from its [`RouteFeed`].

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::{Result, internal_err};
use datafusion::datasource::{TableProvider, TableType};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::StreamExt;

use crate::feed::RouteFeed;

/// What the scan node shows about its source.
#[derive(Debug, Clone)]
pub struct ScanInfo {
    /// `FileSourceExec`, `PostgresSourceExec`, ...
    pub exec_name: &'static str,
    pub source: String,
    pub table: String,
    /// Redacted source parameters (`path=...`).
    pub detail: String,
}

/// A source table as DataFusion sees it: an unbounded change stream.
#[derive(Debug)]
pub struct ChangeTableProvider {
    schema: SchemaRef,
    info: ScanInfo,
    feed: Arc<RouteFeed>,
}

impl ChangeTableProvider {
    /// The provider of a route's source table.
    pub fn new(schema: SchemaRef, info: ScanInfo, feed: Arc<RouteFeed>) -> Self {
        ChangeTableProvider { schema, info, feed }
    }
}

#[async_trait]
impl TableProvider for ChangeTableProvider {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
    fn table_type(&self) -> TableType {
        TableType::Base
    }
    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if let Some(p) = projection
            && p.len() != self.schema.fields().len()
        {
            return internal_err!("change scans take no projection pushdown");
        }
        Ok(Arc::new(ChangeScanExec::new(
            Arc::clone(&self.schema),
            self.info.clone(),
            Arc::clone(&self.feed),
        )))
    }
}

/// The scan node: yields each batch the runner sends into the feed and
/// records where it ends.
#[derive(Debug)]
pub struct ChangeScanExec {
    info: ScanInfo,
    feed: Arc<RouteFeed>,
    properties: Arc<PlanProperties>,
}

impl ChangeScanExec {
    /// The scan reading `feed`.
    pub fn new(schema: SchemaRef, info: ScanInfo, feed: Arc<RouteFeed>) -> Self {
        ChangeScanExec {
            info,
            feed,
            properties: super::stream_properties(schema),
        }
    }
}

impl DisplayAs for ChangeScanExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match t {
            DisplayFormatType::TreeRender => {
                writeln!(f, "source={}", self.info.source)?;
                write!(f, "table={}", self.info.table)
            }
            _ => {
                write!(
                    f,
                    "{}: source={}, table={}",
                    self.info.exec_name, self.info.source, self.info.table
                )?;
                if !self.info.detail.is_empty() {
                    write!(f, ", {}", self.info.detail)?;
                }
                Ok(())
            }
        }
    }
}

impl ExecutionPlan for ChangeScanExec {
    fn name(&self) -> &str {
        self.info.exec_name
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }
    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }
    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }
    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return internal_err!("{} has one partition", self.info.exec_name);
        }
        let Some(receiver) = self.feed.take_receiver() else {
            return internal_err!(
                "{} for {}.{} has no feed connected (or was executed twice)",
                self.info.exec_name,
                self.info.source,
                self.info.table
            );
        };
        let feed = Arc::clone(&self.feed);
        let stream = tokio_stream_from(receiver).map(move |rb| {
            feed.push_boundary(crate::feed::Boundary {
                end: rb.end,
                open_transaction: rb.open_transaction,
                may_defer: rb.may_defer,
            });
            Ok(rb.batch)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            stream,
        )))
    }
}

fn tokio_stream_from<T: Send + 'static>(
    rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> + Send {
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|v| (v, rx)) })
}
