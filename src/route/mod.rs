//! A route in service: its policy (`config::RouteConfig`, pure data) with
//! the runtime parts the server gives it when it puts the route in service
//! (its upstream connection slots, its counters), and the table that finds
//! a request's route by prefix. This is the one place config becomes a
//! running route.

mod table;

use std::ops::Deref;
use std::sync::Arc;

pub use table::{LiveRoutes, RouteTable};

use crate::config::RouteConfig;
use crate::http::{Outcome, RouteLabel};
use crate::metrics::{Metrics, RouteMetrics};
use crate::proxy::UpstreamSlots;

/// A route in service: its policy, which it reads as (`Deref`), and what
/// serving it takes.
#[derive(Debug, Clone)]
pub struct Route {
    pub config: RouteConfig,
    /// The cap on this route's open upstream connections
    /// (`max_upstream_connections`), over every client connection and stream.
    pub upstream_slots: UpstreamSlots,
    /// Its requests' counters, registered under its name.
    pub metrics: Arc<RouteMetrics>,
}

impl Deref for Route {
    type Target = RouteConfig;

    fn deref(&self) -> &RouteConfig {
        &self.config
    }
}

/// The access log's view of a route: its name and its counters, as the
/// request was routed, whatever table serves requests by the time it is logged.
impl RouteLabel for Route {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn record(&self, outcome: Outcome, status: u16, seconds: f64, settled: bool) {
        self.metrics.record(outcome, status, seconds, settled);
    }
}

impl Route {
    /// This route as a running fencegate serves it: counted in `metrics`
    /// under its name, with a connection cap of its own (each running
    /// fencegate counts its own upstream connections, even when built from
    /// one config), or the cap of `serving`, the route a reload replaces,
    /// when it has the same name, upstream and cap: its connections stay
    /// counted.
    pub fn in_service(config: &RouteConfig, metrics: &Metrics, serving: Option<&Route>) -> Route {
        let upstream_slots = match serving {
            Some(old)
                if old.name == config.name
                    && old.upstream == config.upstream
                    && old.upstream_http2 == config.upstream_http2
                    && old.max_upstream_connections == config.max_upstream_connections
                    && old.upstream_idle_timeout == config.upstream_idle_timeout =>
            {
                old.upstream_slots.clone()
            }
            _ => UpstreamSlots::new(config.max_upstream_connections, config.upstream_idle_timeout),
        };
        Route { config: config.clone(), upstream_slots, metrics: metrics.route(&config.name) }
    }
}

/// A route with small test values, in service nowhere, for unit tests elsewhere in the crate.
#[cfg(test)]
pub(crate) fn test_route(name: &str, prefix: &str) -> Route {
    Route::detached(crate::config::test_route_config(name, prefix))
}

impl Route {
    /// `config` as a route counted nowhere, with slots of its own: for
    /// harnesses that route requests without serving them.
    pub fn detached(config: RouteConfig) -> Route {
        let upstream_slots = UpstreamSlots::new(config.max_upstream_connections, config.upstream_idle_timeout);
        Route { config, upstream_slots, metrics: RouteMetrics::detached() }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A reload keeps a route's upstream connections counted when its name,
    /// upstream and limits are the same, as configured: a cap past what the
    /// slots can hold (clamped inside them) is the same cap on both sides.
    #[test]
    fn a_reload_keeps_the_slots_of_an_unchanged_route() {
        let metrics = Metrics::new(["objects"], None);
        for cap in [4, usize::MAX] {
            let config =
                RouteConfig { max_upstream_connections: cap, ..crate::config::test_route_config("objects", "/o/") };
            let serving = Route::in_service(&config, &metrics, None);
            let again = Route::in_service(&config, &metrics, Some(&serving));
            assert!(again.upstream_slots.shared_with(&serving.upstream_slots), "cap {cap}");
        }
        let config = crate::config::test_route_config("objects", "/o/");
        let serving = Route::in_service(&config, &metrics, None);
        for changed in [
            RouteConfig { max_upstream_connections: config.max_upstream_connections + 1, ..config.clone() },
            RouteConfig {
                upstream_idle_timeout: config.upstream_idle_timeout + Duration::from_secs(1),
                ..config.clone()
            },
        ] {
            let renewed = Route::in_service(&changed, &metrics, Some(&serving));
            assert!(!renewed.upstream_slots.shared_with(&serving.upstream_slots));
        }
    }
}
