"""The dashboard's logic, kept out of the Streamlit scripts so it can be tested without a server.

    data    -- which store to show (a local DB or the shipped H200 data) and pandas frames read
               from it: runs, per-layer speed, roofline points, memory plans, sparsity;
    charts  -- small pure functions from those frames to Altair charts (specs tests inspect);
    ui      -- the Streamlit glue the pages share: cached reads, the DB chooser, tables with
               CSV download, error messages instead of tracebacks.

The app itself is dashboard/app.py (`streamlit run dashboard/app.py` or `jaxcnn dashboard`).
"""
