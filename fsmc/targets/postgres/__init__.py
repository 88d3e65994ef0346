"""The PostgreSQL target, one room a job (each module's docstring states its contract):

- `names`: the identifiers of one installation, raw, quoted once at the edge.
- `encode`: spec facts as SQL expressions, constants and types.
- `install`: the writer role, its grants, the search_path pin, the application's grants.
- `model`: the schema's objects as frozen data, each rendering its CREATE statement.
- `formats`: the schema format's history, the steps `fsmc migrate` takes first.
- `operations`: the steps of a migration script as frozen data (`fsmc migrate`'s plan).
- `comments`: the sentences printed above the file's objects.
- `build`: the only builder, `Machine -> Build`, which knows every other room.

Data flows one way: `build` uses the others; none of them uses `build` (`formats`
names its type only); `fsmc.migrate` takes finished `Build`s and plans `operations`.
"""
