//! The route table: routes in the order a path finds them, longest prefix first.

use std::sync::Arc;

use arc_swap::{ArcSwap, Guard};

use super::Route;

/// The table requests are routed by now. A config reload replaces it; a
/// request keeps the route it was given (its `Arc<Route>`) to its end.
#[derive(Debug)]
pub struct LiveRoutes(ArcSwap<RouteTable>);

impl LiveRoutes {
    pub fn new(table: RouteTable) -> LiveRoutes {
        LiveRoutes(ArcSwap::from_pointee(table))
    }

    /// The current table, for one request (no lock, no reference count).
    pub fn load(&self) -> Guard<Arc<RouteTable>> {
        self.0.load()
    }

    /// The current table, to keep.
    pub fn current(&self) -> Arc<RouteTable> {
        self.0.load_full()
    }

    /// Requests routed from now on use `table`.
    pub fn replace(&self, table: RouteTable) {
        self.0.store(Arc::new(table));
    }
}

/// Routes sorted so that the first prefix that matches is the longest.
#[derive(Debug, Clone, Default)]
pub struct RouteTable {
    /// `(index in config order, route)`, longest prefix first.
    routes: Vec<(usize, Arc<Route>)>,
}

impl RouteTable {
    pub fn new(routes: impl IntoIterator<Item = Route>) -> Self {
        let mut routes: Vec<(usize, Arc<Route>)> = routes.into_iter().map(Arc::new).enumerate().collect();
        routes.sort_by_key(|(_, r)| std::cmp::Reverse(r.prefix.len()));
        RouteTable { routes }
    }

    /// The route whose prefix is the longest one `path` starts with.
    pub fn find(&self, path: &str) -> Option<&Arc<Route>> {
        self.find_indexed(path).map(|(_, r)| r)
    }

    /// Like [`find`](Self::find), with the route's index in config order.
    pub fn find_indexed(&self, path: &str) -> Option<(usize, &Arc<Route>)> {
        self.routes.iter().find(|(_, r)| r.covers(path)).map(|(i, r)| (*i, r))
    }

    /// The route named `name`.
    pub fn named(&self, name: &str) -> Option<&Arc<Route>> {
        self.routes.iter().map(|(_, r)| r).find(|r| &*r.name == name)
    }

    /// Route names in config order.
    pub fn names(&self) -> Vec<Arc<str>> {
        let mut named: Vec<_> = self.routes.iter().map(|(i, r)| (*i, r.name.clone())).collect();
        named.sort_by_key(|(i, _)| *i);
        named.into_iter().map(|(_, n)| n).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::test_route as route;

    #[test]
    fn longest_prefix_wins_whatever_the_config_order() {
        let t = RouteTable::new([route("root", "/"), route("objects", "/objects/"), route("deep", "/objects/deep/")]);
        assert_eq!(&*t.find("/objects/deep/x").unwrap().name, "deep");
        assert_eq!(&*t.find("/objects/x").unwrap().name, "objects");
        assert_eq!(&*t.find("/objects").unwrap().name, "root");
        assert_eq!(&*t.find("/other").unwrap().name, "root");
        let t = RouteTable::new([route("objects", "/objects/")]);
        assert!(t.find("/other").is_none());
        assert!(t.find("/objects").is_none());
    }
}
