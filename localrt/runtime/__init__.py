"""Behind the HTTP edge: the service (requests -> prompts -> engine), the per-model scheduler and the catalog."""
