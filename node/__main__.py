from node.main import main

raise SystemExit(main())
