//! The tonic service: each RPC is a thin call into [`Agent`].

use std::pin::Pin;
use std::sync::Arc;

use cgloop_proto::v1::node_agent_service_server::NodeAgentService;
use cgloop_proto::v1::*;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use crate::agent::{Agent, HasOutcome};
use crate::metrics::Metrics;

pub struct Service {
    agent: Arc<Agent>,
    metrics: Arc<Metrics>,
}

impl Service {
    pub fn new(agent: Arc<Agent>) -> Self {
        Self::with_metrics(agent, Arc::new(Metrics::default()))
    }

    /// A service counting its requests and actions into `metrics`.
    pub fn with_metrics(agent: Arc<Agent>, metrics: Arc<Metrics>) -> Self {
        Self { agent, metrics }
    }

    /// A mutating call: counted as a request and as an action.
    async fn act<T: HasOutcome + Send + 'static>(
        &self,
        method: &'static str,
        f: impl FnOnce(&Agent) -> Result<T, crate::error::AgentError> + Send + 'static,
    ) -> Reply<T> {
        let mut reply = call(&self.agent, f).await;
        self.metrics.request(method, &reply);
        self.metrics.action(method, &mut reply);
        reply
    }

    /// A reading call: counted as a request.
    async fn read<T: Send + 'static>(
        &self,
        method: &'static str,
        f: impl FnOnce(&Agent) -> Result<T, crate::error::AgentError> + Send + 'static,
    ) -> Reply<T> {
        let reply = call(&self.agent, f).await;
        self.metrics.request(method, &reply);
        reply
    }
}

type Reply<T> = Result<Response<T>, Status>;

/// Runs a (briefly blocking: netlink, BPF syscalls, sysfs) agent call off the async workers.
async fn call<T: Send + 'static>(
    agent: &Arc<Agent>,
    f: impl FnOnce(&Agent) -> Result<T, crate::error::AgentError> + Send + 'static,
) -> Reply<T> {
    let agent = agent.clone();
    tokio::task::spawn_blocking(move || f(&agent))
        .await
        .map_err(|e| Status::internal(format!("agent task failed: {e}")))?
        .map(Response::new)
        .map_err(Status::from)
}

#[tonic::async_trait]
impl NodeAgentService for Service {
    async fn apply_queue_hierarchy(&self, r: Request<ApplyQueueHierarchyRequest>) -> Reply<ApplyQueueHierarchyResponse> {
        let r = r.into_inner();
        self.act("ApplyQueueHierarchy", move |a| a.apply_queue_hierarchy(&r)).await
    }

    async fn set_flow_class(&self, r: Request<SetFlowClassRequest>) -> Reply<SetFlowClassResponse> {
        let r = r.into_inner();
        self.act("SetFlowClass", move |a| a.set_flow_class(&r)).await
    }

    async fn set_class_rate(&self, r: Request<SetClassRateRequest>) -> Reply<SetClassRateResponse> {
        let r = r.into_inner();
        self.act("SetClassRate", move |a| a.set_class_rate(&r)).await
    }

    async fn set_power_policy(&self, r: Request<SetPowerPolicyRequest>) -> Reply<SetPowerPolicyResponse> {
        let r = r.into_inner();
        self.act("SetPowerPolicy", move |a| a.set_power_policy(&r)).await
    }

    async fn get_power_state(&self, r: Request<GetPowerStateRequest>) -> Reply<GetPowerStateResponse> {
        let r = r.into_inner();
        self.read("GetPowerState", move |a| a.get_power_state(&r)).await
    }

    async fn set_chain(&self, r: Request<SetChainRequest>) -> Reply<SetChainResponse> {
        let r = r.into_inner();
        self.act("SetChain", move |a| a.set_chain(&r)).await
    }

    async fn start_probe(&self, r: Request<StartProbeRequest>) -> Reply<StartProbeResponse> {
        let r = r.into_inner();
        self.act("StartProbe", move |a| a.start_probe(&r)).await
    }

    async fn stop_probe(&self, r: Request<StopProbeRequest>) -> Reply<StopProbeResponse> {
        let r = r.into_inner();
        self.act("StopProbe", move |a| a.stop_probe(&r)).await
    }

    async fn get_state(&self, _r: Request<GetStateRequest>) -> Reply<GetStateResponse> {
        self.read("GetState", |a| a.state().map(|s| GetStateResponse { state: Some(s) })).await
    }

    type WatchStateStream = Pin<Box<dyn Stream<Item = Result<WatchStateResponse, Status>> + Send>>;

    async fn watch_state(&self, r: Request<WatchStateRequest>) -> Reply<Self::WatchStateStream> {
        let reply = self.watch(r).await;
        self.metrics.request("WatchState", &reply);
        reply
    }

    async fn set_impairment(&self, r: Request<SetImpairmentRequest>) -> Reply<SetImpairmentResponse> {
        let r = r.into_inner();
        self.act("SetImpairment", move |a| a.set_impairment(&r)).await
    }

    async fn protect_flows(&self, r: Request<ProtectFlowsRequest>) -> Reply<ProtectFlowsResponse> {
        let r = r.into_inner();
        self.act("ProtectFlows", move |a| a.protect_flows(&r)).await
    }
}

impl Service {
    async fn watch(&self, r: Request<WatchStateRequest>) -> Reply<<Self as NodeAgentService>::WatchStateStream> {
        let since = r.into_inner().since_generation;
        let rx = self.agent.subscribe();
        let initial = if since == 0 || since != self.agent.generation() {
            let agent = self.agent.clone();
            let state = tokio::task::spawn_blocking(move || agent.state())
                .await
                .map_err(|e| Status::internal(format!("agent task failed: {e}")))?
                .map_err(Status::from)?;
            Some(WatchStateResponse { state: Some(state), cause_action_id: String::new() })
        } else {
            None
        };
        let changes = tokio_stream::wrappers::WatchStream::from_changes(rx).map(|(state, cause)| {
            Ok(WatchStateResponse { state: Some(state), cause_action_id: cause })
        });
        let stream = tokio_stream::iter(initial.into_iter().map(Ok)).chain(changes);
        Ok(Response::new(Box::pin(stream)))
    }
}
