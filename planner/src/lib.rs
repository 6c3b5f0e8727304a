//! urutau's planner: the pipeline model ([`spec`]) and its validation, the
//! canonical types and the closed cast matrix, the metadata catalog, the
//! sink contract, and the lowering of every route into DataFusion logical
//! and physical plans.
//!
//! Front ends (`urutau-sql`) produce a [`spec::PipelineSpec`]; the binary
//! fills a [`registry::Registry`] with the engine's sources and the sinks
//! crate's sinks; [`plan::plan_pipeline`] turns both into a
//! [`plan::PipelinePlan`] that the engine runs.

pub mod bind;
pub mod cast;
pub mod certificate;
pub mod context;
pub mod diagnostic;
pub mod evolution;
pub mod feed;
pub mod functions;
pub mod logical;
pub mod metadata;
pub mod options;
pub mod partition;
pub mod physical;
pub mod plan;
pub mod progress;
pub mod registry;
pub mod sink;
pub mod spec;
pub mod target;
pub mod types;
pub mod validate;
