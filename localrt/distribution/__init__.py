"""Moving models between stores: pull (registry, folder, bundle), push, the registry routes, bundles."""
