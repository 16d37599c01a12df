//! The tonic service: each RPC is a thin call into [`Agent`].

use std::pin::Pin;
use std::sync::Arc;

use cgloop_proto::v1::node_agent_service_server::NodeAgentService;
use cgloop_proto::v1::*;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use crate::agent::Agent;

pub struct Service {
    agent: Arc<Agent>,
}

impl Service {
    pub fn new(agent: Arc<Agent>) -> Self {
        Self { agent }
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
        call(&self.agent, move |a| a.apply_queue_hierarchy(&r)).await
    }

    async fn set_flow_class(&self, r: Request<SetFlowClassRequest>) -> Reply<SetFlowClassResponse> {
        let r = r.into_inner();
        call(&self.agent, move |a| a.set_flow_class(&r)).await
    }

    async fn set_class_rate(&self, r: Request<SetClassRateRequest>) -> Reply<SetClassRateResponse> {
        let r = r.into_inner();
        call(&self.agent, move |a| a.set_class_rate(&r)).await
    }

    async fn set_power_policy(&self, r: Request<SetPowerPolicyRequest>) -> Reply<SetPowerPolicyResponse> {
        let r = r.into_inner();
        call(&self.agent, move |a| a.set_power_policy(&r)).await
    }

    async fn get_power_state(&self, r: Request<GetPowerStateRequest>) -> Reply<GetPowerStateResponse> {
        let r = r.into_inner();
        call(&self.agent, move |a| a.get_power_state(&r)).await
    }

    async fn set_chain(&self, r: Request<SetChainRequest>) -> Reply<SetChainResponse> {
        let r = r.into_inner();
        call(&self.agent, move |a| a.set_chain(&r)).await
    }

    async fn start_probe(&self, r: Request<StartProbeRequest>) -> Reply<StartProbeResponse> {
        let r = r.into_inner();
        call(&self.agent, move |a| a.start_probe(&r)).await
    }

    async fn stop_probe(&self, r: Request<StopProbeRequest>) -> Reply<StopProbeResponse> {
        let r = r.into_inner();
        call(&self.agent, move |a| a.stop_probe(&r)).await
    }

    async fn get_state(&self, _r: Request<GetStateRequest>) -> Reply<GetStateResponse> {
        call(&self.agent, |a| a.state().map(|s| GetStateResponse { state: Some(s) })).await
    }

    type WatchStateStream = Pin<Box<dyn Stream<Item = Result<WatchStateResponse, Status>> + Send>>;

    async fn watch_state(&self, r: Request<WatchStateRequest>) -> Reply<Self::WatchStateStream> {
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

    async fn set_impairment(&self, r: Request<SetImpairmentRequest>) -> Reply<SetImpairmentResponse> {
        let r = r.into_inner();
        call(&self.agent, move |a| a.set_impairment(&r)).await
    }

    async fn protect_flows(&self, r: Request<ProtectFlowsRequest>) -> Reply<ProtectFlowsResponse> {
        let r = r.into_inner();
        call(&self.agent, move |a| a.protect_flows(&r)).await
    }
}
