"""Request classes: realtime and batch requests routed to their own pools through the gateway."""
