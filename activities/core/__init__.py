"""Side effects several capabilities share (a verified download, the route's one traffic policy).
Imports no capability's activities."""
