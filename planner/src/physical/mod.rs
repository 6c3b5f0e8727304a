//! The physical operators of a route: the change scan, the change filter,
//! the per-key collapse and the sink node. Each maps one input batch to one
//! output batch (see [`crate::feed`]).

mod change_filter;
mod collapse;
mod scan;
mod sink_exec;

pub use change_filter::ChangeFilterExec;
pub use collapse::{CollapseExec, collapse_batch};
pub use scan::{ChangeScanExec, ChangeTableProvider, ScanInfo};
pub use sink_exec::{SinkCommitError, SinkExec};

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::{Partitioning, PlanProperties};

/// Properties shared by every route operator: one partition, incremental
/// emission, unbounded (a change stream has no end unless the run stops).
pub(crate) fn stream_properties(schema: SchemaRef) -> Arc<PlanProperties> {
    Arc::new(PlanProperties::new(
        EquivalenceProperties::new(schema),
        Partitioning::UnknownPartitioning(1),
        EmissionType::Incremental,
        Boundedness::Unbounded {
            requires_infinite_memory: false,
        },
    ))
}
